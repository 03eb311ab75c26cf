"""The stand-ins of `stare sim`: GPU work replaced by the cost model's time on a virtual clock.

Each stands behind a seam the real roles use, so the real code around it runs unchanged:

* `SimEngine` - `rollout.engines.base.RolloutEngine` (blocking `generate`) and the streaming protocol
  (`capacity`, `add`, `step`, `pending`, in-flight weight updates): sequences decode in continuous batches,
  response lengths drawn from the run's `LengthModel`, every engine step timed by the cost model, each
  token's weight version recorded;
* `SimLearner` - the learner's `train_step`, `prepare` (the pre-pass ahead of a step, timed),
  `state_dict_for_rollout` (the weight gather), `save`/`load` (checkpoint writes) and its real
  `EntropyController`;
* `SimWeights` - the weight publisher and, per worker, the subscriber (`fetch`, `wait_for`);
* `SimTask` / `SimTokenizer` - prompts of the configured length for the real `PromptFeeder`;
  `solve_rate_scorer` - the reward worker's scorer seam (each prompt has a solve rate; the real
  `GroupCollector` filters the groups whose rewards are all equal).

A `Lane` is one GPU group's timeline: what it did when, for the busy fractions and the Gantt chart.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rollout.engines.base import Completion, SampleLengths, SamplingParams, streaming_capacity
from stare.data.tasks.base import Problem

KINDS = ("decode", "prefill", "train", "send/receive", "checkpoint")


@dataclass
class Lane:
    """A set of GPUs acting together (a rollout engine's, the learner's): its clock and its intervals."""

    name: str
    gpus: list[int]
    now: float = 0.0
    intervals: list[tuple[float, float, str]] = field(default_factory=list)

    def busy(self, seconds: float, kind: str) -> None:
        """Work of `kind` from now on; the clock moves past it (adjacent intervals of a kind merge)."""
        if seconds <= 0:
            return
        start, end = self.now, self.now + seconds
        if self.intervals and self.intervals[-1][2] == kind and abs(self.intervals[-1][1] - start) < 1e-12:
            start = self.intervals[-1][0]
            self.intervals[-1] = (start, end, kind)
        else:
            self.intervals.append((start, end, kind))
        self.now = end

    def wait_until(self, t: float) -> None:
        self.now = max(self.now, t)

    def busy_in(self, t0: float, t1: float) -> dict[str, float]:
        """Seconds of each kind inside [t0, t1]."""
        out = dict.fromkeys(KINDS, 0.0)
        for a, b, kind in self.intervals:
            out[kind] += max(0.0, min(b, t1) - max(a, t0))
        return out


# ---------------------------------------------------------------------------------------- rollout
@dataclass
class _Seq:
    key: object
    target: int  # response tokens it will produce
    prompt_len: int
    done: int = 0
    versions: list[tuple[int, int]] = field(default_factory=list)  # (first token, weight version) runs


class SimEngine:
    """A rollout engine on a virtual clock. Steps are event-driven: between two completions every
    running sequence grows by one token per step, so a span of k steps is priced in closed form
    (`NodeCosts.decode_span_s`). `capacity()` is what the streaming worker may keep in the engine (as
    VLLMEngine's: room for max_model_len tokens a sample); the engine itself runs up to `running`
    sequences (vLLM allocates KV blocks as sequences grow: about the cache over a mean sequence), more
    wait in its queue."""

    def __init__(
        self,
        lane: Lane,
        costs,
        lengths,
        *,
        capacity: int,
        seed: int,
        running: int | None = None,
        kv=None,
        eos_id: int = 2,
        max_model_len: int = 1 << 20,
        vocab_size: int = 1 << 20,
    ):
        self.lane, self.costs, self.lengths = lane, costs, lengths
        self._capacity, self.eos_id = capacity, eos_id
        self._running = running or capacity
        self.kv, self._finished_lengths = kv, SampleLengths()  # kv: capacity() as VLLMEngine's, from lengths seen
        self.max_model_len, self.vocab_size = max_model_len, vocab_size
        self.rng = np.random.default_rng(seed)
        self.weight_version = 0
        self.running: list[_Seq] = []
        self.queue: list[tuple[object, list[int], SamplingParams]] = []
        self.groups: dict[object, list] = {}  # key -> [n, finished completions by index, versions]
        self.horizon: float | None = None  # streaming: stop a span at this time (new work may arrive)
        self.static_batch = False  # price every step at the call's row count (a padded batch: hf engine)
        self._rows = 0
        self.inflight_updates = True  # a version taken between steps applies to the running sequences' next tokens

    # -------------------------------------------------------------- the streaming protocol
    def capacity(self) -> int:
        if self.kv is None:
            return self._capacity
        return streaming_capacity(
            self.kv.tokens, self.kv.max_num_seqs, self._finished_lengths.reserve(self.kv.max_model_len)
        )

    def add(self, prompt: list[int], params: SamplingParams, key: object) -> None:
        """Queue one prompt's `params.n` completions; they start as slots free up."""
        self.queue.append((key, list(prompt), params))

    def pending(self) -> int:
        """Prompts added whose completions are not all returned yet."""
        return len(self.groups) + len(self.queue)

    def sequences(self) -> int:
        return len(self.running) + sum(params.n for _, _, params in self.queue)

    def step(self) -> list[tuple[object, list[Completion]]]:
        """Admit what fits, then decode to the next completion (or the horizon); the prompts whose
        n completions all finished."""
        self._admit()
        if not self.running:
            return []
        k = min(s.target - s.done for s in self.running)
        if self.horizon is not None and self.horizon > self.lane.now:
            per_step = self.costs.decode_span_s(1, len(self.running), self._context())
            k = max(1, min(k, int((self.horizon - self.lane.now) / max(per_step, 1e-12)) + 1))
        rows = self._rows if self.static_batch else len(self.running)
        self.lane.busy(self.costs.decode_span_s(k, rows, self._context()), "decode")
        for s in self.running:
            s.done += k
        finished = [s for s in self.running if s.done >= s.target]
        self.running = [s for s in self.running if s.done < s.target]
        if not self.running:
            self._rows = 0
        out = []
        for s in finished:
            key, j = s.key
            group = self.groups[key]
            group[1][j] = self._completion(s)
            if all(c is not None for c in group[1]):
                out.append((key, group[1]))
                del self.groups[key]
        return out

    # -------------------------------------------------------------- the blocking seam
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """One blocking call: every completion of every prompt, the call lasting until the longest."""
        keys = [("generate", i) for i in range(len(prompts))]
        for key, p in zip(keys, prompts):
            self.add(p, params, key)
        results: dict[object, list[Completion]] = {}
        horizon, self.horizon = self.horizon, None
        try:
            while len(results) < len(prompts):
                results.update(self.step())
        finally:
            self.horizon = horizon
        return [results[k] for k in keys]

    def update_weights(self, state_dict, version: int) -> None:
        self.weight_version = version
        for s in self.running:  # in flight: their next tokens come from this version
            if s.versions[-1][0] == s.done:
                s.versions[-1] = (s.done, version)
            else:
                s.versions.append((s.done, version))

    def close(self) -> None:
        pass

    # -------------------------------------------------------------- internals
    def _context(self) -> float:
        return float(sum(s.prompt_len + s.done for s in self.running))

    def _admit(self) -> None:
        prefill = 0
        while self.queue and (not self.running or len(self.running) + self.queue[0][2].n <= self._running):
            key, prompt, params = self.queue.pop(0)
            targets = self.lengths.sample(self.rng, params.n)
            targets = np.minimum(targets, params.max_new_tokens)
            self.groups[key] = [params.n, [None] * params.n]
            for j, t in enumerate(targets):
                self.running.append(_Seq((key, j), int(t), len(prompt), versions=[(0, self.weight_version)]))
            prefill += len(prompt)  # the group's samples share the prompt's KV (prefix caching)
        self._rows = max(self._rows, len(self.running))
        if prefill:
            self.lane.busy(self.costs.prefill_s(prefill), "prefill")

    def _completion(self, s: _Seq) -> Completion:
        self._finished_lengths.add(s.prompt_len + s.target)
        capped = s.target >= self.lengths.cap
        ids = [1] * s.target
        if not capped:
            ids[-1] = self.eos_id
        return Completion(
            token_ids=ids,
            logprobs=[-0.5] * s.target,
            finish_reason="length" if capped else "stop",
            versions=list(s.versions),
        )


# ---------------------------------------------------------------------------------------- learner
class SimLearner:
    """The learner's seam on the learner lane: train_step, the weight gather, checkpoint writes.
    `colocated`: the learner shares the rollout engines' GPUs, so a step starts once every engine
    is idle (they sleep) and the engines wake after it."""

    def __init__(
        self,
        cfg,
        lane: Lane,
        step_s: Callable[[list], float],
        gather_s: float,
        checkpoint_s: float,
        *,
        wait_engines: Callable[[], float] | None = None,
        prepass_s: Callable[[list], float] | None = None,
    ):
        from learner.algorithm.entropy_controller import EntropyController

        self.cfg, self.lane = cfg, lane
        self.step_s, self.gather_s, self.checkpoint_s = step_s, gather_s, checkpoint_s
        self.wait_engines, self.prepass_s = wait_engines, prepass_s
        self.prepared: set[str] = set()  # trajectory ids pre-passed at the current version
        self.controller = EntropyController(cfg.controller, max_entropy=10.0)
        self.step = self.version = 0
        self.trained_tokens: list[tuple[float, int]] = []  # (end time, tokens) per step

    def train_step(self, trajectories: list) -> dict[str, Any]:
        if self.wait_engines is not None:
            self.lane.wait_until(self.wait_engines())
        ahead = [t for t in trajectories if t.trajectory_id in self.prepared]  # their pre-pass already ran
        saved = self.prepass_s(ahead) if ahead and self.prepass_s is not None else 0.0
        self.lane.busy(self.step_s(trajectories) - saved, "train")
        self.prepared = set()  # the weights move on
        # tokens the step trains on: a response's tokens left out of the loss (older than max_staleness) do not count
        tokens = sum(len(t.prompt_token_ids) + int(np.count_nonzero(t.loss_mask)) for t in trajectories)
        self.trained_tokens.append((self.lane.now, tokens))
        self.step += 1
        self.version += 1
        c = self.controller
        return {
            "step": self.step,
            "weight_version": self.version,
            "loss": 0.0,
            "entropy": c.target,
            "gate": False,
            "w": c.w,
            "m": c.m,
            "target": c.target,
            "grad_norm": 0.0,
        }

    def prepare(self, trajectories: list) -> None:
        """The pre-pass ahead of a step (the session calls it while it waits for data): its time on the
        learner lane now, taken out of the step that trains these trajectories. Colocated it stays in the
        step: the GPUs are the engines' while they sample."""
        new = [t for t in trajectories if t.trajectory_id not in self.prepared]
        if self.prepass_s is None or self.wait_engines is not None or not new:
            return
        self.lane.busy(self.prepass_s(new), "train")
        self.prepared.update(t.trajectory_id for t in new)

    def state_dict_for_rollout(self) -> dict:
        self.lane.busy(self.gather_s, "send/receive")
        return {}

    def save(self, directory: Path, extra: dict[str, Any]) -> str:
        self.lane.busy(self.checkpoint_s, "checkpoint")
        tag = f"step_{self.step:06d}"
        (directory / tag).mkdir(parents=True, exist_ok=True)
        (directory / tag / "sim.json").write_text(json.dumps({"step": self.step, "time_s": self.lane.now}))
        return tag

    def load(self, directory: Path, tag: str | None = None) -> dict[str, Any]:
        raise NotImplementedError("stare sim starts fresh runs only")


# ---------------------------------------------------------------------------------------- weights
class SimWeights:
    """Publisher (learner lane) and subscribers (one view per rollout lane). A version published at
    learner time t is sendable at t; a worker takes it at max(its clock, t) and is busy receiving
    for `recv_s`. `sync` (max_staleness 0, no background publisher): the learner waits out the send."""

    def __init__(self, learner: Lane, send_s: float, recv_s: float, *, sync: bool):
        self.learner, self.send_s, self.recv_s, self.sync = learner, send_s, recv_s, sync
        self.sent: list[tuple[int, float]] = []  # (version, sendable at)

    def publish(self, version: int, state_dict) -> None:
        self.sent.append((version, self.learner.now))
        if self.sync:
            self.learner.busy(self.send_s, "send/receive")

    def serve_joiners(self, version: int, state_fn) -> bool:
        return False

    def close(self) -> None:
        pass

    def view(self, lane: Lane) -> WeightView:
        return WeightView(self, lane)


class WeightView:
    def __init__(self, board: SimWeights, lane: Lane):
        self.board, self.lane = board, lane

    def newest(self, have: int, at: float) -> tuple[int, float] | None:
        ok = [(v, t) for v, t in self.board.sent if v > have and t <= at]
        return max(ok) if ok else None

    def fetch(self, have_version: int):
        got = self.newest(have_version, self.lane.now)
        if got is None:
            return None
        if self.board.sync:  # a synchronous broadcast from t_send: an idle worker took part from its start
            self.lane.busy(max(0.0, got[1] + self.board.recv_s - self.lane.now), "send/receive")
        else:
            self.lane.busy(self.board.recv_s, "send/receive")
        return got[0], {}

    def wait_for(self, min_version: int, timeout_s: float) -> bool:
        times = [t for v, t in self.board.sent if v >= min_version]
        if not times:
            raise RuntimeError(
                f"stare sim: a worker waits for weight version {min_version}, never published "
                "(a scheduling bug in the simulated node)"
            )
        self.lane.wait_until(min(times))
        return True

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------- data
class SimTokenizer:
    pad_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1] * max(1, len(text.split()))

    def __call__(self, texts: list[str], add_special_tokens: bool = False) -> dict[str, list[list[int]]]:
        return {"input_ids": [self.encode(t) for t in texts]}

    def batch_decode(self, ids, skip_special_tokens: bool = True) -> list[str]:
        return [""] * len(ids)


class SimTask:
    """Problems with prompts of `prompt_len` tokens (+/- 25%) and a solve rate each, drawn from
    Beta(a, b): the answer field carries it to the scorer."""

    name = "sim"

    def __init__(self, prompt_len: int, solve_beta: tuple[float, float], seed: int, pool: int = 4096):
        self.prompt_len, self.solve_beta, self.pool, self.seed = prompt_len, solve_beta, pool, seed

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        rng = random.Random(seed * 31 + 7)
        out = []
        for i in range(min(n, self.pool)):
            length = max(1, int(self.prompt_len * rng.uniform(0.75, 1.25)))
            p = rng.betavariate(*self.solve_beta)
            out.append(
                Problem(
                    prompt="w " * length,
                    answer=f"{p:.6f}",
                    problem_id=f"sim-{i}",
                    level=1,
                    data_source="sim",
                    prompt_token_ids=[1] * length,
                )
            )
        return out

    def extract_answer(self, completion: str) -> str | None:
        return None

    def reward(self, problem: Problem, completion: str) -> float:
        return 0.0


def solve_rate_scorer(seed: int) -> Callable[[list], None]:
    """The reward worker's scorer seam: a sample is right with its prompt's solve rate."""

    def score(batch: list) -> None:
        for t in batch:
            rng = random.Random(f"{seed}:{t.trajectory_id}")
            right = rng.random() < float(t.answer)
            t.reward, t.reward_info = float(right), {"correct": right, "finish_reason": t.finish_reason}

    return score
