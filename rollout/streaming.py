"""The rollout worker's streaming loop: the engine fed continuously (`system.rollout_streaming`).

Purpose: keep a rollout engine's batch at what its KV cache holds instead of one blocking batch
of `rollout_batch_prompts` prompts that waits for its longest response. Each round:

1. publish what has finished (held back only while the downstream stream is full);
2. top the engine up: add prompts (held-out evaluation tasks first, then training prompts, each
   with its group's own seed) while `engine.sequences() + n <= engine.capacity()` (a sample that has
   ended frees its room at once, while its group's others still run);
3. one `engine.step()`; every prompt whose n completions have all ended is published as one group
   (training: `raw.publish_and_ack`, the records and the ack of their prompt in one transaction;
   evaluation: `eval_raw` then the ack, as the EvalSampler does).

Weights and staleness: a prompt is sampled with weights of at least its `min_weight_version`.
By default the engine takes a new version only between steps when nothing of the old version is in
flight: a prompt that needs newer weights stops the top-up, the engine drains, the worker takes the
newest weights (waiting for the learner if it has to), then the prompt goes in. With nothing in
flight the worker takes the newest weights before adding anything (as the batch loop does before
each batch), so strictly on-policy runs sample what the batch loop samples: per-group seeds make
the random numbers independent of which prompts share a step (tests/rollout/test_streaming.py).

In-flight weight updates (`inflight=True`, `system.inflight_weight_updates`; an engine with
`inflight_updates`): before every engine step the worker takes the newest published version, with
prompts in flight (PipelineRL's semantics: running sequences go on, their later tokens from the new
weights). No drain: a prompt that needs a version not yet published waits in the queue while the
engine steps the others, and only an empty engine waits for the learner. Each record carries the
version of every token (`Trajectory.version_starts`, from the engine's `Completion.versions`); the
learner bounds staleness per token (learner/loop/group_collector.py).

Durability: a prompt is acknowledged only in the transaction that publishes its group; prompts in
the engine, or delivered and waiting for room, stay pending, so a worker that dies (or stops)
mid-stream leaves them to be delivered again (its successor re-reads them; another worker
reclaims them after `system.claim_idle_s`). A prompt the engine refuses (`add` raises ValueError)
is handed back with `fail` (dead-lettered after `max_deliveries`); a `step` that raises fails
every prompt in flight and propagates (the engine's state is unknown: the process restarts).

Not covered: the tool loop (multi-turn rows; the worker samples in batches when tool use is on).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections import deque
from typing import Literal

from rollout.engines.base import Completion, SamplingParams, StreamingEngine, derive_seed
from stare.transport.base import Delivery, RecordStream
from stare.transport.guard import describe

log = logging.getLogger(__name__)

Kind = Literal["train", "eval"]


def streaming_enabled(cfg, engine) -> bool:
    """Whether a rollout worker of run config `cfg` streams over `engine`:
    `system.rollout_streaming` (None: on for the vllm engine or with in-flight weight updates, off for
    hf), never with the tool loop."""
    wanted = cfg.system.rollout_streaming
    if wanted is None:
        wanted = cfg.rollout.engine.name == "vllm" or cfg.system.inflight_weight_updates
    if not wanted:
        return False
    if cfg.rollout.tool_use.enabled:
        log.info("rollout streaming off: the tool loop samples in batches")
        return False
    if not isinstance(engine, StreamingEngine):
        raise ValueError(
            f"system.rollout_streaming is on but the {type(engine).__name__} engine does not stream; "
            "set system.rollout_streaming: false"
        )
    return True


def streaming_loop(cfg, worker, engine, evals=None) -> StreamingLoop | None:
    """The streaming loop a rollout worker of run config `cfg` runs over `engine` (its evaluations through
    `evals`), or None when it samples in batches (`streaming_enabled`); in-flight weight updates as
    `system.inflight_weight_updates` says."""
    if not streaming_enabled(cfg, engine):
        return None
    return StreamingLoop(worker, engine, evals, inflight=cfg.system.inflight_weight_updates)


@dataclasses.dataclass
class _Slot:
    kind: Kind
    delivery: Delivery
    version: int  # weights it is admitted with (its first token's, unless the engine says otherwise)


class StreamingLoop:
    """Drives a `StreamingEngine` for a RolloutWorker (and its EvalSampler); see the module docstring.

    `worker`: the RolloutWorker whose streams, weights, screening, seeds and records this uses;
    `engine`: the same engine as a StreamingEngine; `evals`: the EvalSampler sharing it (or None)."""

    def __init__(self, worker, engine: StreamingEngine, evals=None, *, inflight: bool = False):
        if inflight and not getattr(engine, "inflight_updates", False):
            raise ValueError(
                f"system.inflight_weight_updates is on but the {type(engine).__name__} engine cannot take "
                "weights with prompts in flight; set system.inflight_weight_updates: false"
            )
        self.worker, self.engine, self.evals, self.inflight = worker, engine, evals, inflight
        self._slots: dict[int, _Slot] = {}  # key -> what the engine holds under it
        self._waiting: deque[tuple[Kind, Delivery]] = deque()  # delivered and screened, not yet in the engine
        self._finished: list[tuple[_Slot, list[Completion]]] = []  # sampled, not yet published
        self._keys = itertools.count()
        self._n_hint: dict[Kind, int] = {}  # the n last seen per kind: how many deliveries to ask for
        self.published = 0  # training groups published

    def in_flight(self) -> int:
        """Prompts delivered to this worker and not yet published (in the engine, waiting or finished)."""
        return len(self._slots) + len(self._waiting) + len(self._finished)

    # --- one round ---------------------------------------------------------------------------

    def run_once(self, block_s: float = 0.0) -> int:
        """Publish, top up, one engine step, publish; returns the training groups published. Waits up
        to `block_s` for prompts only when the engine is empty."""
        done = self._publish()
        if not self.worker.should_stop() and self._top_up(block_s) and self.engine.pending():
            self._take()
            done += self._publish()
        return done

    def offer(self, kind: Kind, deliveries: list[Delivery]) -> None:
        """Deliveries this worker took over (reclaimed from a dead worker): screened and queued
        ahead of new ones."""
        self._waiting.extendleft((kind, d) for d in reversed(self._screen(kind, deliveries)))

    # --- admission ---------------------------------------------------------------------------

    def _top_up(self, block_s: float) -> bool:
        """Add prompts while the engine has room; False if asked to stop while waiting for weights."""
        w = self.worker
        if self.inflight or (not self._slots and not self._finished):
            w.sync_weights()  # the newest weights: in flight, or with nothing in flight (as before a batch)
        while not self._finished:  # results held back (downstream full): no new work until they are out
            if not self._waiting:
                if not self._pull(0.0 if self._slots else block_s):
                    return True
                block_s = 0.0
                continue  # what came may all have been screened out
            kind, d = self._waiting[0]
            n, need = self._shape(kind, d.record)
            if self._slots and self.engine.sequences() + n > self.engine.capacity():
                return True  # full: the next step frees room
            if need > self.engine.weight_version:
                if self._slots:  # drain first (a new version only with nothing of the old one in flight), or,
                    return True  # in flight, step the others until the learner has published it
                if not w._await_weights(need):
                    return False  # stopping: the prompt stays pending for this worker's successor
            self._waiting.popleft()
            self._add(kind, d, n)
        return True

    def _pull(self, block_s: float) -> bool:
        """Ask the streams for as many prompts as the free room holds (evaluation tasks first; a
        stream whose prompts do not fit is not asked: they stay there for other workers); True if
        anything was delivered."""
        room = self.engine.capacity() - self.engine.sequences()
        sources: list[tuple[Kind, RecordStream]] = [("train", self.worker.prompts)]
        if self.evals is not None:
            sources.insert(0, ("eval", self.evals.tasks))
        for i, (kind, stream) in enumerate(sources):
            n = self._n_hint.get(kind)  # the last n seen of this stream (None before the first)
            if self._slots and room < (n or 1):
                continue
            last = i == len(sources) - 1
            # before the first task of a stream its n is unknown: one task (room // 1 would take n times too
            # many, pending on this worker while other workers idle)
            deliveries = stream.consume(
                self.worker.name, 1 if n is None else max(1, room // n), block_s if last else 0.0
            )
            if deliveries:
                self._waiting.extend((kind, d) for d in self._screen(kind, deliveries))
                return True
        return False

    def _screen(self, kind: Kind, deliveries: list[Delivery]) -> list[Delivery]:
        return self.worker._screen(deliveries) if kind == "train" else self.evals._screen(deliveries)

    def _shape(self, kind: Kind, record) -> tuple[int, int]:
        """(sequences, min weight version) of a task."""
        n = record.group_size if kind == "train" else record.n
        self._n_hint[kind] = n
        return n, record.min_weight_version

    def _add(self, kind: Kind, d: Delivery, n: int) -> None:
        w, t = self.worker, d.record
        if kind == "train":  # the batch loop's seed: (run seed, group id), whoever batches it
            params = SamplingParams(
                n=n,
                max_new_tokens=w.max_new_tokens,
                temperature=w.temperature,
                top_p=w.top_p,
                stop_token_ids=w.stop_token_ids,
                prompt_seeds=(derive_seed(w.seed, t.group_id),),
            )
        else:
            params = SamplingParams(
                n=n,
                max_new_tokens=t.max_new_tokens,
                temperature=t.temperature,
                top_p=t.top_p,
                stop_token_ids=w.stop_token_ids,
                prompt_seeds=(t.seed,),
            )
        key = next(self._keys)
        try:
            self.engine.add(list(t.prompt_token_ids), params, key)
        except ValueError as err:  # the engine cannot sample it: handed back, dead-lettered after max_deliveries
            log.warning("entry %s refused by the engine (%s); it will be delivered again", d.id, describe(err))
            self._stream(kind).fail([d.id], describe(err))
            return
        self._slots[key] = _Slot(kind, d, self.engine.weight_version)

    def _stream(self, kind: Kind) -> RecordStream:
        return self.worker.prompts if kind == "train" else self.evals.tasks

    # --- stepping and publishing -------------------------------------------------------------

    def _take(self) -> None:
        """One engine step; its finished prompts move to `_finished`."""
        try:
            results = self.engine.step()
        except Exception as err:
            slots, self._slots = list(self._slots.values()), {}
            for kind in ("train", "eval"):
                if ids := [s.delivery.id for s in slots if s.kind == kind]:
                    self._stream(kind).fail(ids, describe(err))
            raise
        for key, completions in results:
            slot = self._slots.pop(key)
            self._finished.append((slot, completions))

    def _publish(self) -> int:
        """Publish every finished group (training ones with the ack of their prompts in one
        transaction); a full downstream stream raises with the rest kept for the next round."""
        if not self._finished:
            return 0
        w = self.worker
        train = [(s, c) for s, c in self._finished if s.kind == "train"]
        done = 0
        if train:
            records = w._records(
                [s.delivery.record for s, _ in train], [c for _, c in train], versions=[s.version for s, _ in train]
            )
            w.raw.publish_and_ack(records, w.prompts, [s.delivery.id for s, _ in train])
            self._finished = [(s, c) for s, c in self._finished if s.kind != "train"]
            done = len(train)
            self.published += done
        if self._finished:  # evaluation groups
            records = [
                self.evals._trajectory(s.delivery.record, j, c, version=s.version)
                for s, completions in self._finished
                for j, c in enumerate(completions)
            ]
            self.evals.raw.publish(records)
            self.evals.tasks.ack([s.delivery.id for s, _ in self._finished])
            self.evals.sampled += len(self._finished)
            self._finished = []
        return done
