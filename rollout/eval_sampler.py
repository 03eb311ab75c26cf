"""A rollout worker's evaluation duty: held-out tasks in (eval_prompts), sampled trajectories out
(eval_raw), read before the training prompts (stare.transport.eval_streams).

Each task is sampled with weights of at least its `min_weight_version` (the version under
evaluation; the worker waits for them as for training prompts), with the task's own n,
temperature and top_p and its own seed (so samples do not depend on batching), by the worker's
sampler (the tool agent when tool use is on). A prompt the worker cannot sample (over the
engine's length, a token outside the vocabulary) is dead-lettered with the reason; a batch that
raises is retried task by task and a task that keeps failing ends in the dead-letter stream
(stare.transport.guard). Tasks of an evaluation the learner closed (it timed out) are
acknowledged without sampling. Tasks are acknowledged only after their trajectories are published.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from stare.transport.records import EvalTask, Trajectory
from stare.rollout.engine import SamplingParams
from stare.rollout.prompt_guard import fit_prompt, prompt_limit
from stare.rollout.worker import version_fields
from stare.transport.base import RecordStream
from stare.transport.guard import process_guarded

log = logging.getLogger(__name__)


class EvalSampler:
    def __init__(self, worker, tasks: RecordStream, raw: RecordStream, *,
                 is_open: Callable[[str], bool] = lambda eval_id: True):
        self.worker = worker  # the RolloutWorker whose engine, sampler, weights and name this uses
        self.tasks, self.raw, self.is_open = tasks, raw, is_open
        self.sampled = 0  # tasks sampled (a heartbeat counter)

    def run_once(self, max_tasks: int, block_s: float = 0.0) -> int:
        """Sample one batch of pending evaluation tasks (first those this worker holds); returns how many."""
        return self.handle(self.tasks.consume(self.worker.name, max_tasks, block_s))

    def handle(self, deliveries: list) -> int:
        return process_guarded(self.tasks, deliveries, self.process)

    def _screen(self, deliveries: list) -> list:
        """The deliveries to sample; closed evaluations acknowledged, unsampleable prompts dead-lettered."""
        kept, closed, open_ = [], [], {}
        for d in deliveries:
            t: EvalTask = d.record
            if open_.setdefault(t.eval_id, self.is_open(t.eval_id)) is False:
                closed.append(d.id)
                continue
            # held-out prompts went through data.max_prompt_len on the learner: only the engine's room is checked
            limit = prompt_limit(None, getattr(self.worker.engine, "max_model_len", None), t.max_new_tokens)
            _, reason = fit_prompt(t.prompt_token_ids, limit, "reject", getattr(self.worker.engine, "vocab_size", None))
            if reason is not None:
                self.tasks.dead_letter(d.id, t, reason)
                continue
            kept.append(d)
        if closed:
            log.info("skipped %d tasks of closed evaluations", len(closed))
            self.tasks.ack(closed)
        return kept

    def process(self, deliveries: list) -> int:
        deliveries = self._screen(deliveries)
        if not deliveries:
            return 0
        tasks: list[EvalTask] = [d.record for d in deliveries]
        if not self.worker._await_weights(max(t.min_weight_version for t in tasks)):
            return 0  # stopping: the tasks stay pending for this worker's successor
        w = self.worker
        sampler = w.agent or w.engine
        outputs: list = [None] * len(tasks)
        settings = [(t.n, t.temperature, t.top_p, t.max_new_tokens) for t in tasks]
        for setting in dict.fromkeys(settings):  # one generate call per distinct sampling setting
            idx = [i for i, s in enumerate(settings) if s == setting]
            n, temperature, top_p, max_new_tokens = setting
            out = sampler.generate([tasks[i].prompt_token_ids for i in idx], SamplingParams(
                n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                stop_token_ids=w.stop_token_ids, prompt_seeds=tuple(tasks[i].seed for i in idx)))
            for i, completions in zip(idx, out):
                outputs[i] = completions
        records = [self._trajectory(t, j, c) for t, completions in zip(tasks, outputs) for j, c in enumerate(completions)]
        self.raw.publish(records)
        self.tasks.ack([d.id for d in deliveries])
        self.sampled += len(tasks)
        return len(tasks)

    def _trajectory(self, task: EvalTask, j: int, c, version: int | None = None) -> Trajectory:
        """Sample j of `task`, sampled with weights `version` (None: the engine's current one)."""
        return Trajectory(
            run_id=task.run_id, trajectory_id=f"{task.task_id}:{j}", group_id=task.task_id, group_size=task.n,
            **version_fields(c, self.worker.engine.weight_version if version is None else version),
            prompt_token_ids=np.asarray(task.prompt_token_ids, dtype=np.int32),
            response_token_ids=np.asarray(c.token_ids, dtype=np.int32),
            response_logprobs=np.asarray(c.logprobs, dtype=np.float32),
            loss_mask=np.asarray(getattr(c, "loss_mask", [1] * len(c.token_ids)), dtype=np.uint8),
            finish_reason=c.finish_reason, answer=task.answer, problem_id=task.problem_id,
            data_source=task.data_source, level=task.level, turns=getattr(c, "turns", 1),
            response_text=self.worker.tokenizer.decode(c.token_ids, skip_special_tokens=True),
        )
