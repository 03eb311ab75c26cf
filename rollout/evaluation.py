"""Held-out evaluation: greedy accuracy, pass@n and avg@n, overall and per level / data source.

Each data source is sampled with its own settings (`task.eval_sources`: n, temperature, top_p; the
paper reports AIME24/25 avg@32 at top_p 0.7); other sources use `task.eval_k`,
`task.eval_temperature`, `task.eval_top_p`. avg@n is the mean reward of a problem's n samples;
pass@n is 1 when any of them is correct; both are averaged over the source's problems. The
overall `pass_at_k` / `avg_at_k` average over all problems (whatever their n).

`engine` may be a `ToolAgent` (same `generate` shape): then the responses are multi-turn and the
result also has `tool_call_rate`, the share of sampled responses that ran at least one tool call.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Mapping

from stare.prompt_policy import prompt_ids
from stare.rollout.engine import RolloutEngine, SamplingParams
from stare.tasks.base import Problem, Task


@dataclass(frozen=True)
class SourceSampling:
    n: int
    temperature: float
    top_p: float


def eval_settings(cfg, final: bool = False) -> dict[str, Any]:
    """`evaluate` keyword arguments from a run config (a stare.config.TrainConfig); `final`: the run's
    last evaluation, with `task.final_eval_k` samples when set."""
    t = cfg.task
    return {
        "k": t.final_eval_k if final and t.final_eval_k is not None else t.eval_k, "temperature": t.eval_temperature, "top_p": t.eval_top_p,
        "per_source": {src: SourceSampling(s.n, s.temperature, s.top_p) for src, s in t.eval_sources.items()},
        "max_new_tokens": cfg.rollout.max_new_tokens, "seed": cfg.run.seed * 7 + 1,
    }


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
    default = SourceSampling(k, temperature, top_p)
    prompts = [prompt_ids(p, tokenizer) for p in problems]
    greedy = engine.generate(prompts, SamplingParams(n=1, max_new_tokens=max_new_tokens, temperature=0.0,
                                                     stop_token_ids=stop_token_ids))
    # one sampled generate call per distinct setting, problems in their original order inside it
    settings_of = [per_source.get(p.data_source, default) for p in problems]
    sampled: list[list] = [[] for _ in problems]
    for setting in dict.fromkeys(settings_of):
        idx = [i for i, s in enumerate(settings_of) if s == setting]
        out = engine.generate([prompts[i] for i in idx], SamplingParams(
            n=setting.n, max_new_tokens=max_new_tokens, temperature=setting.temperature, top_p=setting.top_p,
            seed=seed, stop_token_ids=stop_token_ids))
        for i, samples in zip(idx, out):
            sampled[i] = samples
    text = lambda c: tokenizer.decode(c.token_ids, skip_special_tokens=True)  # noqa: E731
    mean = lambda xs: sum(xs) / max(len(xs), 1)  # noqa: E731
    by_level: dict[int, list[float]] = defaultdict(list)
    by_source: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    greedy_scores, pass_k, avg_k, correct_counts = [], [], [], []
    for problem, g, samples in zip(problems, greedy, sampled):
        correct = task.reward(problem, text(g[0]))
        scores = [task.reward(problem, text(c)) for c in samples]
        correct_counts.append([len(scores), sum(s >= 1.0 for s in scores)])
        greedy_scores.append(correct)
        pass_k.append(float(max(scores) >= 1.0))
        avg_k.append(sum(scores) / len(scores))
        by_level[problem.level].append(correct)
        src = by_source[problem.data_source]
        src["greedy"].append(correct)
        src["pass"].append(pass_k[-1])
        src["avg"].append(avg_k[-1])
    sources = {}
    for name, v in sorted(by_source.items()):
        s = per_source.get(name, default)
        sources[name] = {"problems": len(v["pass"]), "n": s.n, "temperature": s.temperature, "top_p": s.top_p,
                         "greedy_accuracy": mean(v["greedy"]), "avg_at_n": mean(v["avg"]), "pass_at_n": mean(v["pass"])}
    result = {
        "greedy_accuracy": mean(greedy_scores),
        "pass_at_k": mean(pass_k),
        "avg_at_k": mean(avg_k),
        "k": k,
        "problems": len(problems),
        "per_level": {str(level): mean(v) for level, v in sorted(by_level.items())},
        "per_source": sources,
        "pass_at_k_per_source": {name: s["pass_at_n"] for name, s in sources.items()},
        "avg_at_k_per_source": {name: s["avg_at_n"] for name, s in sources.items()},
        # [n, c] per problem: samples and correct ones (the unbiased pass@k of stare.report.passk)
        "correct_counts": correct_counts,
    }
    if sampled and sampled[0] and hasattr(sampled[0][0], "turns"):
        result["tool_call_rate"] = mean([float(c.turns > 1) for samples in sampled for c in samples])
    return result
