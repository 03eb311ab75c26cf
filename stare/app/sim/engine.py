"""`SimEngine`: the rollout engine of `stare sim` on a virtual clock.

It stands behind `rollout.engines.base.RolloutEngine` (blocking `generate`), the streaming protocol
(`capacity`, `add`, `step`, `pending`, in-flight weight updates) and the sleeping one (`sleep`, `wake`,
`asleep`), so the real `RolloutWorker`, `StreamingLoop` and the colocated node drive it: sequences decode in
continuous batches, response lengths drawn from the run's length model, every engine step timed by the cost
model, each token's weight version recorded.

The KV cache as vLLM's scheduler runs it (when `kv` is given): a sequence holds its tokens' KV (a group's
prompt once: prefix caching); a new prompt is admitted while its prompt fits beside what runs (and
`max_num_seqs` allows); when the running sequences' next tokens no longer fit, the newest sequence is
preempted: its KV is freed and it waits at the head of the queue, and its prompt and tokens are prefilled
again when it is re-admitted (vLLM V1's RECOMPUTE; docs.vllm.ai "Optimization and Tuning", Preemption).
`capacity()` is what the streaming worker may keep in the engine, the product's rule
(`rollout.engines.base.streaming_capacity` over `SampleLengths`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rollout.engines.base import Completion, SampleLengths, SamplingParams, streaming_capacity
from stare.app.sim.lanes import Lane


@dataclass
class _Seq:
    key: object
    target: int  # response tokens it will produce
    prompt_len: int
    done: int = 0
    versions: list[tuple[int, int]] = field(default_factory=list)  # (first token, weight version) runs


class SimEngine:
    """A rollout engine on a virtual clock; see the module docstring. Steps are event-driven: between two
    events (a completion, a full cache, the horizon) every running sequence grows by one token a step, so a
    span of k steps is priced in closed form (`NodeCosts.decode_span_s`)."""

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
        sleep_s: float = 0.0,
        wake_s: float = 0.0,
    ):
        self.lane, self.costs, self.lengths = lane, costs, lengths
        self._capacity, self.eos_id = capacity, eos_id
        self._running = running or capacity  # without a KV model: sequences run at once
        self.kv, self._finished_lengths = kv, SampleLengths()  # kv: capacity() as VLLMEngine's, from lengths seen
        self.max_model_len, self.vocab_size = max_model_len, vocab_size
        self.rng = np.random.default_rng(seed)
        self.weight_version = 0
        self.running: list[_Seq] = []
        self.queue: list[tuple[object, list[int], SamplingParams]] = []
        self.preempted: list[_Seq] = []  # waiting to be recomputed (newest preempted first out last)
        self.groups: dict[object, list] = {}  # key -> [n, finished completions by index]
        self.horizon: float | None = None  # streaming: stop a span at this time (new work may arrive)
        self.static_batch = False  # price every step at the call's row count (a padded batch: hf engine)
        self._rows = 0
        self.inflight_updates = True  # a version taken between steps applies to the running sequences' next tokens
        self.preemptions = 0
        self.asleep, self.sleep_s, self.wake_s = False, sleep_s, wake_s
        self.refit_s = 0.0  # a version taken in place (the colocated node: the rank's weights, a device copy)
        self.before_step = None  # a colocated rank's thread waits for its turn here (stare/app/sim/colocated.py)

    # -------------------------------------------------------------- the streaming protocol
    def capacity(self) -> int:
        if self.kv is None:
            return self._capacity
        return streaming_capacity(
            self.kv.tokens, self.kv.max_num_seqs, self._finished_lengths.reserve(self.kv.max_model_len)
        )

    def add(self, prompt: list[int], params: SamplingParams, key: object) -> None:
        """Queue one prompt's `params.n` completions; they start as room frees up."""
        self.queue.append((key, list(prompt), params))

    def pending(self) -> int:
        """Prompts added whose completions are not all returned yet."""
        return len(self.groups) + len(self.queue)

    def sequences(self) -> int:
        return len(self.running) + len(self.preempted) + sum(params.n for _, _, params in self.queue)

    def step(self) -> list[tuple[object, list[Completion]]]:
        """Admit what fits, then decode to the next event (a completion, a full cache, the horizon); the
        prompts whose n completions all finished."""
        if self.before_step is not None:
            self.before_step()
        self._admit()
        if not self.running:
            return []
        k = min(s.target - s.done for s in self.running)
        if self.kv is not None:
            k = min(k, self._room_steps())
        if self.horizon is not None and self.horizon > self.lane.now:
            per_step = self.costs.decode_span_s(1, len(self.running), self._context())
            k = min(k, int((self.horizon - self.lane.now) / max(per_step, 1e-12)) + 1)
        k = max(k, 1)
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
        self.lane.busy(self.refit_s, "send/receive")
        self.weight_version = version
        for s in [*self.running, *self.preempted]:  # in flight: their next tokens come from this version
            if s.versions[-1][0] == s.done:
                s.versions[-1] = (s.done, version)
            else:
                s.versions.append((s.done, version))

    # -------------------------------------------------------------- the sleeping protocol
    def sleep(self) -> None:
        """vLLM sleep mode: the weights to host memory, the KV cache dropped (nothing runs while asleep)."""
        if not self.asleep:
            self.lane.busy(self.sleep_s, "send/receive")
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.lane.busy(self.wake_s, "send/receive")
            self.asleep = False

    def close(self) -> None:
        pass

    # -------------------------------------------------------------- internals
    def _context(self) -> float:
        return float(sum(s.prompt_len + s.done for s in self.running))

    def _used(self) -> int:
        """KV tokens the running sequences hold: each one's response so far, each group's prompt once."""
        prompts = {s.key[0]: s.prompt_len for s in self.running}
        return sum(s.done for s in self.running) + sum(prompts.values())

    def _room_steps(self) -> int:
        """Steps the running sequences can take before the cache is full; preempts the newest ones first when
        not even one fits."""
        while True:
            room = (self.kv.tokens - self._used()) // max(len(self.running), 1)
            if room >= 1 or len(self.running) <= 1:
                return max(int(room), 1)
            s = self.running.pop()  # the newest: vLLM frees its blocks and recomputes it later
            self.preempted.insert(0, s)
            self.preemptions += 1

    def _fits(self, n: int, tokens: int) -> bool:
        if not self.running:
            return True
        if self.kv is None:
            return len(self.running) + n <= self._running
        return len(self.running) + n <= self.kv.max_num_seqs and self._used() + tokens + n <= self.kv.tokens

    def _admit(self) -> None:
        prefill = 0
        while self.preempted:  # recomputed first: its prompt (unless its group still runs) and its tokens
            s = self.preempted[0]
            resident = any(r.key[0] == s.key[0] for r in self.running)
            need = s.done + (0 if resident else s.prompt_len)
            if not self._fits(1, need):
                break
            self.running.append(self.preempted.pop(0))
            prefill += need
        while not self.preempted and self.queue:
            key, prompt, params = self.queue[0]
            if not self._fits(params.n, len(prompt)):
                break
            self.queue.pop(0)
            targets = np.minimum(self.lengths.sample(self.rng, params.n), params.max_new_tokens)
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
