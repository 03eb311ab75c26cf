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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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

__all__ = [
    "EvalSampler",
    "ProblemSamples",
    "SourceSampling",
    "eval_settings",
    "evaluate",
    "sample_problems",
    "score_samples",
]


@dataclass
class ProblemSamples:
    """Held-out problem `index`'s responses (plain data: a node-colocated rank sends its share to rank 0): the
    greedy one first, then the sampled ones, as text and token ids; `turns` per sampled response with tool
    use, else None."""

    index: int
    texts: list[str]
    token_ids: list[list[int]]
    turns: list[int] | None = None


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
    sampling = {"k": k, "temperature": temperature, "top_p": top_p, "per_source": per_source}
    samples = sample_problems(
        engine,
        tokenizer,
        problems,
        range(len(problems)),
        max_new_tokens=max_new_tokens,
        stop_token_ids=stop_token_ids,
        seed=seed,
        **sampling,
    )
    return score_samples(task, problems, samples, judge=judge, version=version, generations=generations, **sampling)


def sample_problems(
    engine: RolloutEngine,
    tokenizer,
    problems: list[Problem],
    indices: Sequence[int],
    *,
    k: int,
    max_new_tokens: int,
    stop_token_ids: tuple[int, ...],
    seed: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    per_source: Mapping[str, SourceSampling] | None = None,
) -> list[ProblemSamples]:
    """The responses to `problems[i]` for each i in `indices`: one greedy, then its setting's n sampled from
    the problem's own seed (`problem_seed(seed, i)`, i its index in `problems`), so any split of the indices
    over engines samples what one engine would."""
    per_source = dict(per_source or {})
    indices = list(indices)
    if not indices:
        return []
    prompts = {i: prompt_ids(problems[i], tokenizer) for i in indices}
    greedy = engine.generate(
        [prompts[i] for i in indices],
        SamplingParams(n=1, max_new_tokens=max_new_tokens, temperature=0.0, stop_token_ids=stop_token_ids),
    )
    # one sampled generate call per distinct setting, problems in their original order inside it
    settings_of = {i: sampling_of(problems[i], k, temperature, top_p, per_source) for i in indices}
    sampled: dict[int, list] = {}
    for setting in dict.fromkeys(settings_of.values()):
        idx = [i for i in indices if settings_of[i] == setting]
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
        sampled.update(zip(idx, out))
    text = lambda c: tokenizer.decode(c.token_ids, skip_special_tokens=True)  # noqa: E731
    return [
        ProblemSamples(
            index=i,
            texts=[text(c) for c in (g[0], *sampled[i])],
            token_ids=[list(c.token_ids) for c in (g[0], *sampled[i])],
            turns=[c.turns for c in sampled[i]] if sampled[i] and hasattr(sampled[i][0], "turns") else None,
        )
        for i, g in zip(indices, greedy)
    ]


def score_samples(
    task: Task,
    problems: list[Problem],
    samples: Sequence[ProblemSamples],
    *,
    k: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    per_source: Mapping[str, SourceSampling] | None = None,
    judge: Judge | None = None,
    version: int = 0,
    generations: int = 0,
) -> dict[str, Any]:
    """`evaluate`'s result from every problem's responses (`samples`: one per problem, in any order), scored
    in one call of `judge` in problem order."""
    by_index = {s.index: s for s in samples}
    if sorted(by_index) != list(range(len(problems))):
        missing = sorted(set(range(len(problems))) - set(by_index))
        raise ValueError(f"held-out responses missing for problems {missing[:10]} of {len(problems)}")
    ordered = [by_index[i] for i in range(len(problems))]
    items = [(problems[s.index], t, ids) for s in ordered for t, ids in zip(s.texts, s.token_ids)]
    verdicts = iter((judge or task_judge(task))(items, version))
    outcomes = []
    for s in ordered:
        first, rest = next(verdicts), [next(verdicts) for _ in s.texts[1:]]
        outcomes.append(
            Outcome(
                greedy=float(first.correct),
                scores=[float(v.correct) for v in rest],
                turns=s.turns,
                errors=sum(v.error is not None for v in (first, *rest)),
            )
        )
    result = summarize(problems, outcomes, k=k, temperature=temperature, top_p=top_p, per_source=dict(per_source or {}))
    if generations:
        result["generations"] = [
            generation_record(
                problems[i], ordered[i].texts[0], outcomes[i].greedy, ordered[i].texts[1], outcomes[i].scores[0]
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
