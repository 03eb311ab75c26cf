"""The node-colocated learner, the learner's side (`system.colocate: on` in `stare learner` / `stare up`):
every learner rank hosts a rollout engine on its GPU that sleeps while the learner steps.

    every rank:  engine built, put to sleep -> Learner (DeepSpeed) -> ...
    rank 0:      session fill round -> pump: prompts waiting? -> SAMPLE op (version, share, gather) to every rank
    every rank:  [ZeRO-3 and newer weights: the gather, a collective] -> took prompts? wake, load its learner's
                 weights in process, sample the prompts stream until it is empty and its engine idle, publish to
                 raw, sleep -> report -> all back (the op's all-gather, the RankChannel timeout)
    rank 0:      the session pulls the groups the reward workers scored; the step (TRAIN op) with every
                 engine asleep (checked at each step on each rank: `TrainsAsleep`)

Nothing is published between steps: each engine takes its own learner's weights at its next wake, and
`DeferredPublish` hands the session weights that are gathered only if something reads them (a one-rank
held-out evaluation). With several ranks the held-out evaluation is an op too (EVALUATE: every rank samples
its share of the problems on its own engine; stare/app/colocation/node_evaluation.py). The rollout side of a rank (engine, worker,
`Colocation`) is built by the application (`RankRollout`; stare/app/colocation/node.py): a role does
not import another role.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import torch

log = logging.getLogger(__name__)

SAMPLE = "sample"  # the op: (weight version, prompts per take, gather) -> this rank's report (a dict)
EVALUATE = "evaluate"  # the op: (weight version, final, problems digest) -> this rank's share of the responses


class RankRollout(Protocol):
    """A learner rank's rollout engine and worker (the application builds it)."""

    def build(self, model_path: Path, rank: int, world: int) -> None:
        """The engine, built and put to sleep: before the learner takes the GPU's memory."""
        ...

    def attach(self, learner) -> None:
        """The worker on the run's streams; the engine's weights come from `learner` (this rank's)."""
        ...

    def sample(self, version: int, share: int, gather: bool) -> dict[str, Any]:
        """This rank's part of a SAMPLE op: {"rank", "prompts" (taken), "engine_version" (after it), ...}."""
        ...

    def asleep(self) -> bool: ...

    def evaluate_part(self, version: int, final: bool, digest: str) -> list:
        """This rank's part of an EVALUATE op: its share of the held-out problems sampled at `version`."""
        ...

    def evaluator(self, learner, world: int) -> Any:
        """Rank 0's held-out evaluator: one rank, on its own engine (woken for it); several, the EVALUATE op
        (`learner` runs it on every rank)."""
        ...

    def summary(self) -> str: ...

    def close(self) -> None: ...


class TrainsAsleep:
    """A rank's learner whose every step first checks that the rank's engine is asleep (and counts it)."""

    def __init__(self, learner, rollout: RankRollout):
        object.__setattr__(self, "_learner", learner)
        object.__setattr__(self, "_rollout", rollout)
        object.__setattr__(self, "steps_asleep", 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._learner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._learner, name, value)

    def train_step(self, trajectories: list) -> dict[str, Any]:
        if not self._rollout.asleep():
            raise RuntimeError("a learner step with this rank's rollout engine awake: both would hold the GPU's memory")
        object.__setattr__(self, "steps_asleep", self.steps_asleep + 1)
        return self._learner.train_step(trajectories)


class DeferredWeights(Mapping):
    """A state dict read only when something reads it (then once): `fetch()` gives it."""

    def __init__(self, fetch: Callable[[], Mapping[str, torch.Tensor]]):
        self._fetch, self._state = fetch, None

    def _read(self) -> Mapping[str, torch.Tensor]:
        if self._state is None:
            self._state = self._fetch()
        return self._state

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._read()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


class DeferredPublish:
    """The learner as the session of a node-colocated run sees it: `state_dict_for_rollout` gathers nothing
    until read (each rank's engine takes its weights at the SAMPLE and EVALUATE ops; only a one-rank
    evaluation reads them)."""

    def __init__(self, learner):
        object.__setattr__(self, "_learner", learner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._learner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._learner, name, value)

    def state_dict_for_rollout(self) -> Mapping[str, torch.Tensor]:
        return DeferredWeights(self._learner.state_dict_for_rollout)


class InProcessPublisher:
    """The session's publisher in a node-colocated run: the version only; the weights stay in the learner
    (each engine loads its own rank's at its next wake). Holds no weights between steps."""

    def __init__(self) -> None:
        self.version = 0

    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.version = version

    def serve_joiners(self, version: int, state_fn) -> bool:
        return False

    def close(self) -> None:
        pass


class SamplePump:
    """Rank 0's `SessionSeams.pump`: when prompts wait, every rank samples (the SAMPLE op; one rank: the
    local part alone). `share`: the prompts a rank takes at a time (the waiting ones over the ranks), `gather`:
    whether the ZeRO-3 gather runs (a new version, or an engine left behind by the last op). An op that took
    nothing (the prompts pending on a consumer that is gone: reclaimed after system.claim_idle_s) is not
    repeated before `retry_s`."""

    def __init__(
        self,
        learner,
        rollout: RankRollout,
        prompts,
        *,
        world: int,
        collective: bool,
        busy: Callable[[str], AbstractContextManager],
        retry_s: float,
        say: Callable[[str], None] = log.info,
    ):
        self.learner, self.rollout, self.prompts = learner, rollout, prompts
        self.world, self.collective, self.busy, self.retry_s, self.say = world, collective, busy, retry_s, say
        self._last_version: int | None = None
        self._behind = True  # an engine older than the version it last sampled with (or not known yet)
        self._quiet_until = 0.0
        self.ops = 0

    def __call__(self, fill_round: int) -> None:
        waiting = self.prompts.backlog()
        if not waiting or time.monotonic() < self._quiet_until:
            return
        version, share = self.learner.version, max(1, math.ceil(waiting / self.world))
        gather = self.collective and (version != self._last_version or self._behind)
        t0 = time.perf_counter()
        with self.busy("sampling"):
            if self.world > 1:
                reports = self.learner.run_op(
                    SAMPLE, (version, share, gather), lambda: self.rollout.sample(version, share, gather)
                )
            else:
                reports = [self.rollout.sample(version, share, gather)]
        self.ops += 1
        self._last_version = version
        self._behind = any(r["engine_version"] < version for r in reports)
        taken = [r["prompts"] for r in reports]
        self.say(
            f"sampled {sum(taken)} of {waiting} waiting prompts at version {version} in "
            f"{time.perf_counter() - t0:.1f} s (by rank: {taken})"
        )
        if not sum(taken):
            self._quiet_until = time.monotonic() + self.retry_s
