"""The rollout worker: prompt tasks in, raw trajectories out.

Before each batch it takes the newest published weights (a worker that missed versions jumps to
the newest). Prompts are acknowledged only after their trajectories are published, so a worker
that dies mid-batch leaves them pending for another worker.

With an `agent` (`rollout.agent_loop.ToolAgent` over the same engine) each sample is a
multi-turn tool-using response: its `loss_mask` (0 on tool observations) and `turns` go into the
Trajectory.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import numpy as np

from rollout.engines.base import RolloutEngine, SamplingParams, derive_seed
from rollout.prompt_guard import Overflow, fit_prompt, prompt_limit
from stare.transport.base import Delivery, RecordStream
from stare.transport.guard import process_guarded
from stare.transport.records import PromptTask, Trajectory
from stare.weight_sync.base import WeightSubscriber

log = logging.getLogger(__name__)


def version_fields(completion, version: int) -> dict:
    """A Trajectory's `weight_version` and `version_starts` for `completion`: the versions its engine
    reported (`Completion.versions`), else `version` for every token."""
    runs = getattr(completion, "versions", None)
    if not runs:
        return {"weight_version": version, "version_starts": []}
    return {"weight_version": int(runs[0][1]), "version_starts": [[int(i), int(v)] for i, v in runs[1:]]}


class RolloutWorker:
    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer,
        prompts: RecordStream,
        raw: RecordStream,
        weights: WeightSubscriber,
        *,
        name: str,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop_token_ids: tuple[int, ...],
        agent=None,
        should_stop: Callable[[], bool] = lambda: False,
        weight_wait_s: float = 1.0,
        seed: int = 0,
        max_prompt_len: int | None = None,
        prompt_overflow: Overflow = "truncate_left",
        tick: Callable[[], None] = lambda: None,
        keep_rows: bool = False,
    ):
        self.engine, self.tokenizer = engine, tokenizer
        # copy each prompt's text and row extra_info into its trajectories (a reward function reads them)
        self.keep_rows = keep_rows
        self.prompts, self.raw, self.weights = prompts, raw, weights
        self.name = name
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.stop_token_ids = stop_token_ids
        self.agent = agent  # a ToolAgent driving `engine`, or None for single-turn completions
        self.should_stop, self.weight_wait_s = should_stop, weight_wait_s
        self.seed = seed  # the run's seed: each group samples from derive_seed(seed, group_id)
        self.prompt_limit = prompt_limit(max_prompt_len, getattr(engine, "max_model_len", None), max_new_tokens)
        self.prompt_overflow = prompt_overflow
        self.truncated_prompts = 0
        self.tick = tick  # liveness while waiting for the learner's weights (it may be evaluating for long)

    def sync_weights(self) -> bool:
        update = self.weights.fetch(self.engine.weight_version)
        if update is None:
            return False
        version, state = update
        self.engine.update_weights(state, version)
        return True

    def run_once(self, max_prompts: int, seed: int | None = None, block_s: float = 0.0) -> int:
        """Sample one batch of pending prompts; returns how many prompts it handled."""
        return self.handle(self.prompts.consume(self.name, max_prompts, block_s), seed)

    def handle(self, deliveries: list, seed: int | None = None) -> int:
        """`process` guarded: a batch that raises is retried prompt by prompt, and a prompt that keeps
        failing ends in the dead-letter stream with its error (stare.transport.guard)."""
        return process_guarded(self.prompts, deliveries, lambda ds: self.process(ds, seed))

    def _screen(self, deliveries: list) -> list:
        """The deliveries fit to sample (over-long prompts truncated left); the others dead-lettered
        with the reason (rollout.prompt_guard)."""
        kept = []
        for d in deliveries:
            ids, reason = fit_prompt(
                d.record.prompt_token_ids,
                self.prompt_limit,
                self.prompt_overflow,
                getattr(self.engine, "vocab_size", None),
            )
            if reason is not None:
                self.prompts.dead_letter(d.id, d.record, reason)
                continue
            if len(ids) < len(d.record.prompt_token_ids):
                self.truncated_prompts += 1
                log.warning(
                    "prompt of group %s: %d tokens truncated left to %d",
                    d.record.group_id,
                    len(d.record.prompt_token_ids),
                    len(ids),
                )
                d = Delivery(d.id, dataclasses.replace(d.record, prompt_token_ids=ids))
            kept.append(d)
        return kept

    def _await_weights(self, min_version: int) -> bool:
        """Take weights of at least `min_version` (waiting for the learner to publish them); False
        if asked to stop first."""
        self.sync_weights()
        while self.engine.weight_version < min_version:
            if self.should_stop():
                return False
            self.tick()
            self.weights.wait_for(min_version, self.weight_wait_s)
            self.sync_weights()
        return True

    def process(self, deliveries: list, seed: int | None = None) -> int:
        """Sample `deliveries` (prompt tasks), publish their trajectories, then acknowledge them.
        seed None (the default): each group seeded by (the worker's run seed, its group id)."""
        deliveries = self._screen(deliveries)
        if not deliveries:
            return 0
        tasks: list[PromptTask] = [d.record for d in deliveries]
        if not self._await_weights(max(t.min_weight_version for t in tasks)):
            return 0  # stopping: the prompts stay pending for this worker's successor
        # seed None: one seed per group, from the run's seed and the group id alone, so neither a
        # redelivery nor how prompts are batched (embedded or distributed) changes the samples.
        prompt_seeds = None if seed is not None else tuple(derive_seed(self.seed, t.group_id) for t in tasks)
        group_size = tasks[0].group_size
        if any(t.group_size != group_size for t in tasks):
            raise ValueError("one batch of prompt tasks must share group_size")
        params = SamplingParams(
            n=group_size,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=seed,
            stop_token_ids=self.stop_token_ids,
            prompt_seeds=prompt_seeds,
        )
        outputs = (self.agent or self.engine).generate([t.prompt_token_ids for t in tasks], params)
        self.raw.publish_and_ack(self._records(tasks, outputs), self.prompts, [d.id for d in deliveries])
        return len(tasks)

    def _records(
        self, tasks: list[PromptTask], outputs: list[list], versions: list[int] | None = None
    ) -> list[Trajectory]:
        """One Trajectory per completion (outputs[i]: the completions of tasks[i], sampled with
        weights versions[i], or the versions each completion reports; None: the engine's current
        version); the responses' texts decoded in
        one batch call, each prompt's ids converted once for its group."""
        texts = iter(
            self.tokenizer.batch_decode([c.token_ids for group in outputs for c in group], skip_special_tokens=True)
        )
        if versions is None:
            versions = [self.engine.weight_version] * len(tasks)
        records = []
        for task, completions, version in zip(tasks, outputs, versions):
            prompt_ids = np.asarray(task.prompt_token_ids, dtype=np.int32)  # shared by the group's records (read-only)
            rows = {"prompt": task.prompt, "extra_info": task.extra_info}
            for j, c in enumerate(completions):
                n = len(c.token_ids)
                mask = getattr(c, "loss_mask", None)
                records.append(
                    Trajectory(
                        run_id=task.run_id,
                        # Deterministic: a prompt sampled twice (a redelivery) yields the same ids, so the
                        # learner's dedup keeps one sampling of the group, never a mix of two.
                        trajectory_id=f"{task.group_id}:{j}",
                        group_id=task.group_id,
                        group_size=task.group_size,
                        **version_fields(c, version),
                        prompt_token_ids=prompt_ids,
                        response_token_ids=np.asarray(c.token_ids, dtype=np.int32),
                        response_logprobs=np.asarray(c.logprobs, dtype=np.float32),
                        loss_mask=np.ones(n, dtype=np.uint8) if mask is None else np.asarray(mask, dtype=np.uint8),
                        finish_reason=c.finish_reason,
                        answer=task.answer,
                        problem_id=task.problem_id,
                        data_source=task.data_source,
                        response_text=next(texts),
                        level=task.level,
                        turns=getattr(c, "turns", 1),
                        **(rows if self.keep_rows else {}),
                    )
                )
        return records
