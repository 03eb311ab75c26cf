"""Held-out evaluation on the rollout side: in process (`evaluate`, `stare train`) and a rollout
worker's evaluation duty through the streams (`EvalSampler`, `stare rollout`).

## In process
Held-out evaluation in process (`stare train`): greedy accuracy, pass@n and avg@n, overall and
per level / data source, on a rollout engine of this process.

What is sampled, the seeds and how scores add up are stare.evaluation.heldout's, shared with the
evaluation through the streams (`stare learner`, learner/loop/stream_evaluator.py): problem i's samples
come from its own seed, so both paths sample the same responses for the same weights.

`engine` may be a `ToolAgent` (same `generate` shape): then the responses are multi-turn and the
result also has `tool_call_rate`, the share of sampled responses that ran at least one tool call.

## Through the streams
A rollout worker's evaluation duty: held-out tasks in (eval_prompts), sampled trajectories out
(eval_raw), read before the training prompts (stare.evaluation.streams).

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
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rollout.engines.base import RolloutEngine, SamplingParams
from rollout.prompt_guard import fit_prompt, prompt_limit
from rollout.worker import version_fields
from stare.data.prompt_policy import prompt_ids
from stare.data.tasks.base import Problem, Task
from stare.evaluation.heldout import (
    Judge,
    Judgement,
    Outcome,
    SourceSampling,
    eval_settings,
    generation_picks,
    generation_record,
    problem_seed,
    sampling_of,
    summarize,
)
from stare.transport.base import RecordStream
from stare.transport.guard import process_guarded
from stare.transport.records import EvalTask, Trajectory

__all__ = ["EvalSampler", "SourceSampling", "eval_settings", "evaluate"]


def evaluate(
    engine: RolloutEngine,
    tokenizer,
    task: Task,
    problems: list[Problem],
    *,
    k: int,
    max_new_tokens: int,
    stop_token_ids: tuple[int, ...],
    seed: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    per_source: Mapping[str, SourceSampling] | None = None,
    judge: Judge | None = None,
    version: int = 0,
    generations: int = 0,
) -> dict[str, Any]:
    """The evaluation's result (stare.evaluation.heldout.summarize). `judge` scores the responses (None: the
    task's own verifier, `task_judge`); a response whose scoring fails counts as incorrect and in
    `reward_errors`, never ends the run. `version`: the weights' version (what a judge may pass on). With
    `generations`, also that many problems' responses per data source under "generations"
    (`generation_picks`: the same problems every time)."""
    per_source = dict(per_source or {})
    prompts = [prompt_ids(p, tokenizer) for p in problems]
    greedy = engine.generate(
        prompts, SamplingParams(n=1, max_new_tokens=max_new_tokens, temperature=0.0, stop_token_ids=stop_token_ids)
    )
    # one sampled generate call per distinct setting, problems in their original order inside it
    settings_of = [sampling_of(p, k, temperature, top_p, per_source) for p in problems]
    sampled: list[list] = [[] for _ in problems]
    for setting in dict.fromkeys(settings_of):
        idx = [i for i, s in enumerate(settings_of) if s == setting]
        out = engine.generate(
            [prompts[i] for i in idx],
            SamplingParams(
                n=setting.n,
                max_new_tokens=max_new_tokens,
                temperature=setting.temperature,
                top_p=setting.top_p,
                stop_token_ids=stop_token_ids,
                prompt_seeds=tuple(problem_seed(seed, i) for i in idx),
            ),
        )
        for i, samples in zip(idx, out):
            sampled[i] = samples
    items = [
        (problem, tokenizer.decode(c.token_ids, skip_special_tokens=True), list(c.token_ids))
        for problem, g, samples in zip(problems, greedy, sampled)
        for c in (g[0], *samples)
    ]
    verdicts = iter((judge or task_judge(task))(items, version))
    outcomes = []
    for samples in sampled:
        first, rest = next(verdicts), [next(verdicts) for _ in samples]
        outcomes.append(
            Outcome(
                greedy=float(first.correct),
                scores=[float(v.correct) for v in rest],
                turns=[c.turns for c in samples] if samples and hasattr(samples[0], "turns") else None,
                errors=sum(v.error is not None for v in (first, *rest)),
            )
        )
    result = summarize(problems, outcomes, k=k, temperature=temperature, top_p=top_p, per_source=per_source)
    if generations:
        text = lambda c: tokenizer.decode(c.token_ids, skip_special_tokens=True)  # noqa: E731
        result["generations"] = [
            generation_record(
                problems[i], text(greedy[i][0]), outcomes[i].greedy, text(sampled[i][0]), outcomes[i].scores[0]
            )
            for i in generation_picks(problems, generations)
        ]
    return result


def task_judge(task: Task) -> Judge:
    """The task's own verifier as a judge: a raise scores that response 0 (an error), never the run."""

    def judge(items: list[tuple[Problem, str, list[int]]], version: int) -> list[Judgement]:
        out = []
        for problem, text, _ in items:
            try:
                score = float(task.reward(problem, text))
            except Exception as err:
                out.append(Judgement(False, 0.0, f"{type(err).__name__}: {err}"))
                continue
            out.append(Judgement(score >= 1.0, score))
        return out

    return judge


log = logging.getLogger(__name__)


class EvalSampler:
    def __init__(
        self, worker, tasks: RecordStream, raw: RecordStream, *, is_open: Callable[[str], bool] = lambda eval_id: True
    ):
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
            out = sampler.generate(
                [tasks[i].prompt_token_ids for i in idx],
                SamplingParams(
                    n=n,
                    max_new_tokens=max_new_tokens,
                    temperature=temperature,
                    top_p=top_p,
                    stop_token_ids=w.stop_token_ids,
                    prompt_seeds=tuple(tasks[i].seed for i in idx),
                ),
            )
            for i, completions in zip(idx, out):
                outputs[i] = completions
        records = [
            self._trajectory(t, j, c) for t, completions in zip(tasks, outputs) for j, c in enumerate(completions)
        ]
        self.raw.publish(records)
        self.tasks.ack([d.id for d in deliveries])
        self.sampled += len(tasks)
        return len(tasks)

    def _trajectory(self, task: EvalTask, j: int, c, version: int | None = None) -> Trajectory:
        """Sample j of `task`, sampled with weights `version` (None: the engine's current one)."""
        return Trajectory(
            run_id=task.run_id,
            trajectory_id=f"{task.task_id}:{j}",
            group_id=task.task_id,
            group_size=task.n,
            **version_fields(c, self.worker.engine.weight_version if version is None else version),
            prompt_token_ids=np.asarray(task.prompt_token_ids, dtype=np.int32),
            response_token_ids=np.asarray(c.token_ids, dtype=np.int32),
            response_logprobs=np.asarray(c.logprobs, dtype=np.float32),
            loss_mask=np.asarray(getattr(c, "loss_mask", [1] * len(c.token_ids)), dtype=np.uint8),
            finish_reason=c.finish_reason,
            answer=task.answer,
            problem_id=task.problem_id,
            data_source=task.data_source,
            level=task.level,
            turns=getattr(c, "turns", 1),
            **({"prompt": task.prompt, "extra_info": task.extra_info} if self.worker.keep_rows else {}),
            response_text=self.worker.tokenizer.decode(c.token_ids, skip_special_tokens=True),
        )
