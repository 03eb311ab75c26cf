"""Held-out evaluation in process (`stare train`): greedy accuracy, pass@n and avg@n, overall and
per level / data source, on a rollout engine of this process.

What is sampled, the seeds and how scores add up are stare.data.heldout's, shared with the
evaluation through the streams (`stare learner`, learner/stream_eval.py): problem i's samples
come from its own seed, so both paths sample the same responses for the same weights.

`engine` may be a `ToolAgent` (same `generate` shape): then the responses are multi-turn and the
result also has `tool_call_rate`, the share of sampled responses that ran at least one tool call.
"""

from __future__ import annotations

from typing import Any, Mapping

from stare.data.heldout import Outcome, SourceSampling, eval_settings, problem_seed, sampling_of, summarize
from stare.data.prompt_policy import prompt_ids
from stare.rollout.engine import RolloutEngine, SamplingParams
from stare.data.tasks.base import Problem, Task

__all__ = ["SourceSampling", "eval_settings", "evaluate"]


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
) -> dict[str, Any]:
    per_source = dict(per_source or {})
    prompts = [prompt_ids(p, tokenizer) for p in problems]
    greedy = engine.generate(prompts, SamplingParams(n=1, max_new_tokens=max_new_tokens, temperature=0.0,
                                                     stop_token_ids=stop_token_ids))
    # one sampled generate call per distinct setting, problems in their original order inside it
    settings_of = [sampling_of(p, k, temperature, top_p, per_source) for p in problems]
    sampled: list[list] = [[] for _ in problems]
    for setting in dict.fromkeys(settings_of):
        idx = [i for i, s in enumerate(settings_of) if s == setting]
        out = engine.generate([prompts[i] for i in idx], SamplingParams(
            n=setting.n, max_new_tokens=max_new_tokens, temperature=setting.temperature, top_p=setting.top_p,
            stop_token_ids=stop_token_ids, prompt_seeds=tuple(problem_seed(seed, i) for i in idx)))
        for i, samples in zip(idx, out):
            sampled[i] = samples
    text = lambda c: tokenizer.decode(c.token_ids, skip_special_tokens=True)  # noqa: E731
    outcomes = [Outcome(greedy=float(task.reward(problem, text(g[0])) >= 1.0),
                        scores=[float(task.reward(problem, text(c)) >= 1.0) for c in samples],
                        turns=[c.turns for c in samples] if samples and hasattr(samples[0], "turns") else None)
                for problem, g, samples in zip(problems, greedy, sampled)]
    return summarize(problems, outcomes, k=k, temperature=temperature, top_p=top_p, per_source=per_source)
