"""Several learner ranks: rank 0 drives, every other rank follows.

    rank 0:  TrainingSession(learner=LeaderLearner(learner, channel), ...)   Redis, feeder, collector,
             publisher, control, evaluation, checkpoint metadata: all on rank 0
    rank r:  follow(learner, channel)                                         no Redis, no ports

Every call of the session that is a collective under DeepSpeed (a training step, gathering the
weights under ZeRO-3, saving or loading a checkpoint) is sent to the followers as an op over a gloo
group of its own (`RankChannel`), so that every rank enters the same collectives in the same order.
A training step's op carries each rank its share of the step's groups (whole groups, so each rank's
advantages are those of the one-rank step; `split_groups`), rank 0's controller state, which the
control plane may have changed, and the pre-pass values rank 0 keeps for that share's rows.

The pre-pass ahead of a step (`prepare`, while the session waits for data): a PREPARE op gives each
rank a balanced share of the groups (`split_groups`), with the micro-batch count and, under ZeRO-3,
the head calls per micro-batch that rank 0 planned for all of them (every rank runs as many forwards
and head calls; the plan is host ints, so no collective of its own); each rank runs the pre-pass
over its share and the values come back to rank 0 (a gloo object gather on the channel's group,
with its timeout), which keeps them all. So a step's split of groups over the ranks owes nothing to
where they were prepared.
An application may add ops of its own (`LeaderLearner.run_op` on rank 0, `follow(..., ops)` on the
others; the node-colocated learner's SAMPLE, learner/process/colocation.py): each ends with the gather of what
every rank's part returned to rank 0, so rank 0 goes on only once every rank is back (or fails after
the channel's timeout).

No hang: every receive waits at most `timeout_s`; while rank 0 has nothing to send (waiting for
data, evaluating, paused) a heartbeat thread sends `idle` every `heartbeat_s`. A follower that
hears nothing for `timeout_s` (rank 0 dead or hung) exits with an error; rank 0 sees a dead follower
before its next op (`FollowerProcesses.check`) or in that op's collective (its group timeout), and
fails. Either way the learner's supervisor (`stare up`, compose, Kubernetes, Ray) restarts the whole
learner, which resumes from its last checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from learner.step.ppo_updates import split_groups

log = logging.getLogger(__name__)

IDLE, STOP, TRAIN, PREPARE, WEIGHTS, SAVE, LOAD = "idle", "stop", "train", "prepare", "weights", "save", "load"


class RankChannel:
    """Rank 0 -> each rank, one op at a time, over a gloo group created for it (every rank must
    construct it, in the same order as their other groups). `timeout_s` bounds every send and
    receive."""

    def __init__(self, timeout_s: float, heartbeat_s: float):
        self.timeout_s, self.heartbeat_s = timeout_s, heartbeat_s
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.lock = threading.Lock()  # rank 0: one op at a time (the heartbeat thread's idle ones too)
        self.last_op = time.monotonic()

    def send(self, messages: list) -> None:
        """Rank 0: messages[r] to rank r (messages[0] stays here). Hold `lock` around send + work."""
        out: list = [None]
        dist.scatter_object_list(out, messages, src=0, group=self.group)
        self.last_op = time.monotonic()

    def receive(self) -> Any:
        """Rank r > 0: the next op (RuntimeError after timeout_s without one)."""
        out: list = [None]
        dist.scatter_object_list(out, None, src=0, group=self.group)
        return out[0]

    def gather(self, obj: Any) -> list | None:
        """Every rank's `obj` on rank 0 (in rank order; None elsewhere), within an op: its timeout too."""
        out = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.group)
        return out


class LeaderLearner:
    """Rank 0's view of a learner of several ranks: the `Learner` interface the session uses, each
    collective call mirrored on every rank. Attributes the session reads or sets (step, version,
    controller, ...) are rank 0's learner's."""

    def __init__(self, learner, channel: RankChannel, check: Callable[[], None] = lambda: None):
        object.__setattr__(self, "_learner", learner)
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_check", check)
        object.__setattr__(self, "_stop_heartbeat", threading.Event())
        thread = threading.Thread(target=self._heartbeat, name="learner-rank-heartbeat", daemon=True)
        object.__setattr__(self, "_thread", thread)
        thread.start()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._learner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._learner, name, value)

    # ------------------------------------------------------------------ ops
    @contextlib.contextmanager
    def _op(self, messages: list) -> Iterator[None]:
        """Send the op to every rank, then run rank 0's part; the heartbeat waits meanwhile."""
        self._check()  # a dead follower: fail now rather than in the collective's timeout
        with self._channel.lock:
            self._channel.send(messages)
            yield
            self._channel.last_op = time.monotonic()

    def _same(self, *op: Any) -> list:
        return [op] * self._channel.world

    def train_step(self, trajectories: list) -> dict[str, Any]:
        learner = self._learner
        shares = split_groups(trajectories, self._channel.world)
        state = {
            "controller": learner.controller.state_dict(),
            "step": learner.step,
            "version": learner.version,
            "lagged_entropy": learner.lagged_entropy,
            "nonfinite_steps": learner.nonfinite_steps,
        }
        kept = [learner.prepared.get(share, learner.version) if r else {} for r, share in enumerate(shares)]
        with self._op([(TRAIN, share, state, values) for share, values in zip(shares, kept)]):
            return learner.train_step(shares[0])

    def prepare(self, trajectories: list) -> None:
        """The pre-pass of these whole groups spread over the ranks; rank 0 keeps every rank's values."""
        learner = self._learner
        shares = split_groups(trajectories, self._channel.world)
        calls = [learner.prepare_calls(share) for share in shares]  # each rank's micro-batches' head calls
        count = max(len(c) for c in calls)
        heads = (
            [max(c[i] if i < len(c) else 1 for c in calls) for i in range(count)]
            if learner.weights_are_collective()
            else []
        )  # ZeRO-3: every rank gathers the head as often
        with self._op([(PREPARE, share, count, heads) for share in shares]):
            values = learner.prepass_values(shares[0], micro_batches=count, min_chunks=heads)
            for part in self._channel.gather(values)[1:]:
                values.update(part)
            learner.prepared.keep(values, learner.version)

    def state_dict_for_rollout(self):
        if not self._learner.weights_are_collective():
            return self._learner.state_dict_for_rollout()  # every rank holds the whole model
        with self._op(self._same(WEIGHTS)):
            return self._learner.state_dict_for_rollout()

    def run_op(self, op: str, args: tuple, local: Callable[[], Any]) -> list:
        """An application's op (`follow(..., ops)` runs it on the other ranks): sent to every rank with
        `args`, then rank 0's part `local()`; returns what every rank's part returned, by rank, once all
        are back (`RankChannel.gather`)."""
        with self._op(self._same(op, *args)):
            return self._channel.gather(local())

    def save(self, directory: Path, extra: dict[str, Any]) -> str:
        with self._op(self._same(SAVE, str(directory))):
            return self._learner.save(directory, extra)

    def load(self, directory: Path, tag: str | None = None) -> dict[str, Any]:
        from learner.engine.checkpoints import choose_checkpoint

        # decided here: every rank loads the same one
        tag = tag or choose_checkpoint(directory, log.warning, self._learner.cfg.run.checkpoint_verify)
        with self._op(self._same(LOAD, str(directory), tag)):
            return self._learner.load(directory, tag)

    def close(self) -> None:
        """Tell the followers to exit (they return from `follow`); stop the heartbeat."""
        self._stop_heartbeat.set()
        with self._channel.lock:
            self._channel.send(self._same(STOP))
        self._thread.join(timeout=self._channel.timeout_s)

    def _heartbeat(self) -> None:
        """While rank 0 sends nothing (waiting for data, evaluating, paused): `idle` every heartbeat_s,
        so that the followers' receive timeout means rank 0 is gone, not busy."""
        channel = self._channel
        while not self._stop_heartbeat.wait(channel.heartbeat_s / 2):
            if time.monotonic() - channel.last_op < channel.heartbeat_s:
                continue
            if not channel.lock.acquire(timeout=channel.heartbeat_s):
                continue  # an op is running: the followers are in it
            try:
                if not self._stop_heartbeat.is_set():
                    channel.send(self._same(IDLE))
            except Exception as err:  # a follower gone: the next op fails loudly (check / its timeout)
                log.error("learner rank heartbeat failed: %s", err)
                return
            finally:
                channel.lock.release()


def follow(learner, channel: RankChannel, ops: Mapping[str, Callable[..., Any]] | None = None) -> int:
    """Rank r > 0: run rank 0's ops until it says stop (returns the number of steps trained here).
    `ops`: the application's own (name -> this rank's part, called with the op's args; what it returns
    goes to rank 0 through `RankChannel.gather`, which ends the op). A receive that times out
    raises: rank 0 is dead or hung, this rank must not outlive it."""
    ops = ops or {}
    steps = 0
    while True:
        try:
            op, *args = channel.receive()
        except RuntimeError as err:
            raise RuntimeError(
                f"learner rank {channel.rank}: nothing from rank 0 for {channel.timeout_s:.0f} s "
                f"(rank 0 dead or hung): {err}"
            ) from err
        if op == IDLE:
            continue
        if op == STOP:
            return steps
        if op == TRAIN:
            share, state, kept = args
            learner.controller.load_state_dict(state["controller"])
            learner.step, learner.version = state["step"], state["version"]
            learner.lagged_entropy, learner.nonfinite_steps = state["lagged_entropy"], state["nonfinite_steps"]
            learner.prepared.keep(kept, learner.version)  # the pre-pass values rank 0 kept for this share
            learner.train_step(share)
            steps += 1
        elif op == PREPARE:
            share, count, heads = args
            channel.gather(learner.prepass_values(share, micro_batches=count, min_chunks=heads))
        elif op == WEIGHTS:
            learner.state_dict_for_rollout()  # its part of the gather; rank 0 publishes
        elif op == SAVE:
            learner.save(Path(args[0]), {})
        elif op == LOAD:
            learner.load(Path(args[0]), args[1])
        elif op in ops:
            channel.gather(ops[op](*args))
        else:
            raise RuntimeError(f"learner rank {channel.rank}: unknown op {op!r} from rank 0")
