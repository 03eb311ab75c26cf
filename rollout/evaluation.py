"""Held-out evaluation: greedy accuracy, pass@k and avg@k, overall and per level / data source.

`engine` may be a `ToolAgent` (same `generate` shape): then the responses are multi-turn and the
result also has `tool_call_rate`, the share of sampled responses that ran at least one tool call.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from stare.rollout.engine import RolloutEngine, SamplingParams
from stare.tasks.base import Problem, Task


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
) -> dict[str, Any]:
    prompts = [tokenizer.encode(p.prompt, add_special_tokens=False) for p in problems]
    greedy = engine.generate(prompts, SamplingParams(n=1, max_new_tokens=max_new_tokens, temperature=0.0,
                                                     stop_token_ids=stop_token_ids))
    sampled = engine.generate(prompts, SamplingParams(n=k, max_new_tokens=max_new_tokens, temperature=1.0,
                                                      seed=seed, stop_token_ids=stop_token_ids))
    text = lambda c: tokenizer.decode(c.token_ids, skip_special_tokens=True)  # noqa: E731
    by_level: dict[int, list[float]] = defaultdict(list)
    by_source: dict[str, list[float]] = defaultdict(list)
    avg_by_source: dict[str, list[float]] = defaultdict(list)
    greedy_scores, pass_k, avg_k = [], [], []
    for problem, g, samples in zip(problems, greedy, sampled):
        correct = task.reward(problem, text(g[0]))
        scores = [task.reward(problem, text(c)) for c in samples]
        greedy_scores.append(correct)
        pass_k.append(float(max(scores) >= 1.0))
        avg_k.append(sum(scores) / len(scores))
        by_level[problem.level].append(correct)
        by_source[problem.data_source].append(float(max(scores) >= 1.0))
        avg_by_source[problem.data_source].append(avg_k[-1])
    mean = lambda xs: sum(xs) / max(len(xs), 1)  # noqa: E731
    result = {
        "greedy_accuracy": mean(greedy_scores),
        "pass_at_k": mean(pass_k),
        "avg_at_k": mean(avg_k),
        "k": k,
        "problems": len(problems),
        "per_level": {str(level): mean(v) for level, v in sorted(by_level.items())},
        "pass_at_k_per_source": {src: mean(v) for src, v in sorted(by_source.items())},
        "avg_at_k_per_source": {src: mean(v) for src, v in sorted(avg_by_source.items())},
    }
    if sampled and hasattr(sampled[0][0], "turns"):
        result["tool_call_rate"] = mean([float(c.turns > 1) for samples in sampled for c in samples])
    return result
