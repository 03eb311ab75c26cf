"""What a held-out evaluation samples and how its scores add up: shared by the in-process evaluator
(rollout/evaluation.py, `stare train`) and the one through the streams (learner/loop/stream_evaluator.py,
`stare learner`), so both give the same numbers for the same weights and seeds.

Each problem is sampled greedily once and `n` times with its data source's settings
(`task.eval_sources`: n, temperature, top_p; the paper reports AIME avg@32 at top_p 0.7; other
sources use `task.eval_k`, `task.eval_temperature`, `task.eval_top_p`). Problem i's samples are
seeded by `problem_seed(seed, i)` alone, so neither the batching nor which worker samples it
changes them (within one engine kind, fp32: see rollout/engines/base.py `prompt_seeds`).

avg@n is the mean score of a problem's n samples; pass@n is 1 when any of them is correct; both
are averaged over the source's problems. The overall `pass_at_k` / `avg_at_k` average over all
problems (whatever their n).
"""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

from stare.data.tasks.base import Problem
from stare.transport.records import EvalTask

if TYPE_CHECKING:
    from stare.config import TrainConfig

KINDS = ("greedy", "sampled")


@dataclass(frozen=True)
class SourceSampling:
    n: int
    temperature: float
    top_p: float


class EvalSettings(TypedDict):
    """The sampling keyword arguments of an evaluation (`eval_settings`)."""

    k: int
    temperature: float
    top_p: float
    per_source: dict[str, SourceSampling]
    max_new_tokens: int
    seed: int


def eval_settings(cfg: TrainConfig, final: bool = False) -> EvalSettings:
    """`evaluate` keyword arguments from a run config (a stare.config.TrainConfig); `final`: the run's
    last evaluation, with `task.final_eval_k` samples when set."""
    t = cfg.task
    return {
        "k": t.final_eval_k if final and t.final_eval_k is not None else t.eval_k,
        "temperature": t.eval_temperature,
        "top_p": t.eval_top_p,
        "per_source": {src: SourceSampling(s.n, s.temperature, s.top_p) for src, s in t.eval_sources.items()},
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "seed": cfg.run.seed * 7 + 1,
    }


GENERATIONS_SEED = 42  # the fixed order the kept generations are chosen in (verl shuffles with seed 42 too)


def generation_picks(problems: Sequence[Problem], per_source: int) -> list[int]:
    """Which problems' responses an evaluation keeps (`logging.eval_generations` per data source), the same at
    every evaluation so a prompt's answers can be followed through the run: per source, its first `per_source`
    problems in a fixed seeded order (verl's trainer.log_val_generations sorts its samples by prompt and
    shuffles them with seed 42, verl/trainer/ppo/ray_trainer.py `_maybe_log_val_generations`)."""
    by_source: dict[str, list[int]] = defaultdict(list)
    for i, p in enumerate(problems):
        by_source[p.data_source].append(i)
    picks: list[int] = []
    for source in sorted(by_source):
        order = sorted(by_source[source], key=lambda i: problems[i].prompt)
        random.Random(GENERATIONS_SEED).shuffle(order)
        picks += sorted(order[:per_source])
    return picks


def generation_record(
    problem: Problem, response: str, score: float, sampled_response: str | None, sampled_score: float | None
) -> dict[str, Any]:
    """One kept generation (a line of generations.jsonl, without its step): the prompt, the reference answer,
    the greedy response and its score, and one sampled response and its score (None: none arrived)."""
    return {
        "data_source": problem.data_source,
        "problem_id": problem.problem_id,
        "prompt": problem.prompt,
        "ground_truth": problem.answer,
        "response": response,
        "score": score,
        "sampled_response": sampled_response,
        "sampled_score": sampled_score,
    }


def problem_seed(seed: int, index: int) -> int:
    """The random stream of held-out problem `index` (a 62-bit seed, stable across processes)."""
    digest = hashlib.blake2b(f"eval:{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def sampling_of(
    problem: Problem, k: int, temperature: float, top_p: float, per_source: Mapping[str, SourceSampling]
) -> SourceSampling:
    return per_source.get(problem.data_source, SourceSampling(k, temperature, top_p))


def task_id(eval_id: str, index: int, kind: str) -> str:
    return f"{eval_id}/{index}/{kind}"


def parse_task_id(value: str) -> tuple[str, int, str] | None:
    """(eval id, problem index, kind) of an eval task id (or of one of its trajectory ids,
    `<task id>:<sample>`); None if it is not one."""
    parts = value.split(":", 1)[0].rsplit("/", 2)
    if len(parts) != 3 or parts[2] not in KINDS or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1]), parts[2]


def eval_tasks(
    problems: Sequence[Problem],
    prompts: Sequence[list[int]],
    *,
    run_id: str,
    eval_id: str,
    version: int,
    k: int,
    temperature: float,
    top_p: float,
    per_source: Mapping[str, SourceSampling],
    max_new_tokens: int,
    seed: int,
) -> list[EvalTask]:
    """The evaluation as tasks for the rollout workers: per problem a greedy one and a sampled one."""
    out = []
    for i, (problem, prompt) in enumerate(zip(problems, prompts)):
        s = sampling_of(problem, k, temperature, top_p, per_source)
        for kind, (n, temp, p) in (("greedy", (1, 0.0, 1.0)), ("sampled", (s.n, s.temperature, s.top_p))):
            out.append(
                EvalTask(
                    run_id=run_id,
                    eval_id=eval_id,
                    task_id=task_id(eval_id, i, kind),
                    prompt_token_ids=list(prompt),
                    answer=problem.answer,
                    problem_id=problem.problem_id,
                    data_source=problem.data_source,
                    level=problem.level,
                    n=n,
                    temperature=temp,
                    top_p=p,
                    max_new_tokens=max_new_tokens,
                    seed=problem_seed(seed, i),
                    min_weight_version=version,
                    prompt=problem.prompt,
                    extra_info=problem.extra_info,
                )
            )
    return out


@dataclass
class Outcome:
    """One problem's scores: its greedy sample and its n sampled ones (1.0 correct, else 0.0);
    `turns` per sampled response with tool use, else None; `errors`: how many of its responses could not
    be scored (the reward failed: counted incorrect)."""

    greedy: float
    scores: list[float]
    turns: list[int] | None = None
    errors: int = 0


class Judgement(NamedTuple):
    """The verdict on one held-out response: right or not, its reward, and why scoring failed (then the
    response counts as incorrect)."""

    correct: bool
    reward: float
    error: str | None = None


Judge = Callable[[list[tuple[Problem, str, list[int]]], int], list[Judgement]]
"""Scores held-out responses: [(problem, response text, response token ids)], the weight version -> one
Judgement each. The in-process evaluation takes one (the run's reward scorer in `stare train`); the
evaluation through the streams reads the reward workers' verdicts (reward_info)."""


def summarize(
    problems: Sequence[Problem],
    outcomes: Sequence[Outcome],
    *,
    k: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    per_source: Mapping[str, SourceSampling] | None = None,
) -> dict[str, Any]:
    """The evaluation's result dict (eval.jsonl): greedy accuracy, pass@k and avg@k overall, per level
    and per data source."""
    per_source = dict(per_source or {})

    def mean(xs: Sequence[float]) -> float:
        return sum(xs) / max(len(xs), 1)

    by_level: dict[int, list[float]] = defaultdict(list)
    by_source: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    greedy_scores, pass_k, avg_k, correct_counts = [], [], [], []
    for problem, o in zip(problems, outcomes, strict=True):
        correct_counts.append([len(o.scores), int(sum(sc >= 1.0 for sc in o.scores))])
        greedy_scores.append(o.greedy)
        pass_k.append(float(max(o.scores) >= 1.0))
        avg_k.append(sum(o.scores) / len(o.scores))
        by_level[problem.level].append(o.greedy)
        src = by_source[problem.data_source]
        src["greedy"].append(o.greedy)
        src["pass"].append(pass_k[-1])
        src["avg"].append(avg_k[-1])
    sources = {}
    for name, v in sorted(by_source.items()):
        s = per_source.get(name, SourceSampling(k, temperature, top_p))
        sources[name] = {
            "problems": len(v["pass"]),
            "n": s.n,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "greedy_accuracy": mean(v["greedy"]),
            "avg_at_n": mean(v["avg"]),
            "pass_at_n": mean(v["pass"]),
        }
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
        # [n, c] per problem: samples and correct ones (the unbiased pass@k of stare.app.report.passk)
        "correct_counts": correct_counts,
    }
    result["reward_errors"] = sum(o.errors for o in outcomes)  # responses whose scoring failed (counted incorrect)
    turns = [t for o in outcomes if o.turns is not None for t in o.turns]
    if turns:
        result["tool_call_rate"] = mean([float(t > 1) for t in turns])
    return result
