"""Who scores responses: this process (`InProcessScorer`) or the scoring processes (`PoolScorer`), behind one
interface, and `build_scorer`, which picks: a reward with a function of the user's own always scores in
the scoring processes (a hang is killed at `reward.scoring.timeout_s`, an allocation fails at
`reward.scoring.memory_mb`, a crash replaces the process), so the same guarantees hold in `stare train`,
`stare reward` (always the pool) and the held-out evaluation; without one `stare train` scores in process,
as the cheap built-in verifiers need no process hop.

    scorer.score(inputs) -> [RewardResult]    # RewardInputs: trajectories (`reward_input`) or held-out texts
    scorer(batch)                             # trajectories scored in place (reward, reward_info)

Each failure (reward 0 with an error) is logged with its sample by `ErrorLog`: the first few per
component, then every 100th with the running count.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from reward.verifiers.compose import RewardInput, RewardResult, compute_reward
from stare.config.reward import RewardConfig
from stare.data.tasks.base import Problem, Task
from stare.evaluation.heldout import Judge, Judgement
from stare.transport.records import Trajectory

log = logging.getLogger(__name__)

POOL_TIMEOUT_S = 30.0  # per response, without a reward section (the task's own verifier)
# what reward.scoring_pool says when the process, not the verifier, failed
_POOL_OUTCOMES = ("timed out", "worker died", "worker did not start", "task could not be sent", "result could not")


def reward_input(t: Trajectory, rows: bool = False) -> RewardInput:
    """What the verifiers judge of a trajectory; `rows`: with its token ids (a function of the user's own
    reads them; its prompt text and extra_info come when the rollout worker copied them)."""
    return RewardInput(
        response=t.response_text,
        response_tokens=len(t.response_token_ids),
        answer=t.answer,
        data_source=t.data_source,
        problem_id=t.problem_id,
        level=max(t.level, 1),
        extra_info=t.extra_info,
        prompt=t.prompt,
        response_token_ids=tuple(t.response_token_ids.tolist()) if rows else (),
        step=t.weight_version,
    )


def problem_input(problem: Problem, text: str, token_ids: list[int], version: int) -> RewardInput:
    """What the verifiers judge of a held-out response."""
    return RewardInput(
        response=text,
        response_tokens=len(token_ids),
        answer=problem.answer,
        data_source=problem.data_source,
        problem_id=problem.problem_id,
        level=problem.level,
        extra_info=problem.extra_info,
        prompt=problem.prompt,
        response_token_ids=tuple(token_ids),
        step=version,
    )


def score_input(task: Task, config: RewardConfig | None, x: RewardInput) -> RewardResult:
    """THE scoring of a response (in process, and in every scoring process): `config` (the run config's
    `reward:` section) composes verifiers; None uses the task's own verifier. Never raises: a failure
    scores 0 with the error."""
    if config is not None:
        return compute_reward(x, config, task=task)
    problem = Problem(prompt=x.prompt, answer=x.answer or "", problem_id=x.problem_id, level=x.level,
                      data_source=x.data_source, extra_info=x.extra_info)  # fmt: skip
    try:
        score = float(task.reward(problem, x.response))
    except Exception as err:  # a verifier failure must not lose the trajectory
        return RewardResult(reward=0.0, error=f"{type(err).__name__}: {err}")
    return RewardResult(reward=score, correct=score >= 1.0)


def reward_info(score: RewardResult, finish_reason: str) -> dict:
    """The reward_info of a scored trajectory (the same keys in every mode)."""
    # correct: the answer is right: the verdict of the reward's judging component (a right answer with an
    # overlong penalty is still right; a verl function's "acc"), else a reward of at least 1.
    correct = score.correct if score.correct is not None else score.reward >= 1.0
    info: dict = {"correct": correct, "finish_reason": finish_reason}
    if score.components:
        info["components"] = dict(score.components)
    if score.error is not None:
        info["error"] = score.error
    return info


class ErrorLog:
    """Logs failed scores with their sample: per component the first `first`, then every `every`-th."""

    def __init__(self, warn: Callable[[str], None] | None = None, first: int = 5, every: int = 100):
        self.warn = warn or log.warning
        self.first, self.every = first, every
        self.counts: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __call__(self, result: RewardResult, x: RewardInput, what: str) -> None:
        if result.error is None:
            return
        component = result.error.split(":", 1)[0]
        self.counts[component] += 1
        n = self.counts[component]
        if n <= self.first or n % self.every == 0:
            more = f" ({n} so far{'; logging every ' + str(self.every) + 'th' if n >= self.first else ''})"
            self.warn(
                f"reward failed, scored 0: {result.error} | {what} data_source={x.data_source} "
                f"problem_id={x.problem_id} response={x.response[:200]!r}{more}"
            )


class Scorer(Protocol):
    errors: ErrorLog
    needs_rows: bool  # a function of the user's own reads each response's token ids, prompt and extra_info

    def score(self, inputs: list[RewardInput]) -> list[RewardResult]: ...

    def close(self) -> None: ...


def score_batch(scorer: Scorer, batch: list[Trajectory]) -> None:
    """Score trajectories in place: reward and reward_info (killed or failed: 0, with the reason)."""
    inputs = [reward_input(t, scorer.needs_rows) for t in batch]
    for t, x, result in zip(batch, inputs, scorer.score(inputs), strict=True):
        t.reward, t.reward_info = float(result.reward), reward_info(result, t.finish_reason)
        scorer.errors(result, x, f"trajectory {t.trajectory_id}")


class InProcessScorer:
    """Scores in this process (the task's verifier or the built-in components: no user code)."""

    def __init__(self, task: Task, config: RewardConfig | None, warn: Callable[[str], None] | None = None):
        self.task, self.config = task, config
        self.errors = ErrorLog(warn)
        self.needs_rows = config is not None and config.needs_rows

    def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        return [score_input(self.task, self.config, x) for x in inputs]

    def __call__(self, batch: list[Trajectory]) -> None:
        score_batch(self, batch)

    def close(self) -> None:
        pass


@functools.lru_cache(maxsize=4)
def _task(name: str, kwargs_json: str) -> Task:
    from stare.data.tasks.registry import build_verifier

    return build_verifier(name, **json.loads(kwargs_json))


@functools.lru_cache(maxsize=4)
def _reward_config(config_json: str) -> RewardConfig | None:
    return None if config_json == "null" else RewardConfig.model_validate_json(config_json)


def score_in_worker(task_name: str, kwargs_json: str, config_json: str, x: RewardInput) -> RewardResult:
    """Runs in a scoring process: `score_input` on one response."""
    return score_input(_task(task_name, kwargs_json), _reward_config(config_json), x)


class PoolScorer:
    """Scores concurrently in a ScoringPool (its own event loop, owned by this object)."""

    def __init__(
        self,
        task_name: str,
        task_kwargs: dict[str, Any],
        workers: int,
        timeout_s: float = POOL_TIMEOUT_S,
        reward_config: RewardConfig | None = None,
        memory_mb: int | None = None,
        warn: Callable[[str], None] | None = None,
    ):
        from reward.scoring_pool import ScoringPool, ScoringPoolConfig
        from reward.verifiers.function import preload

        self.task_name, self.kwargs_json = task_name, json.dumps(task_kwargs, default=str)
        self.config_json = "null" if reward_config is None else reward_config.model_dump_json()
        self.timeout_s = timeout_s
        self.errors = ErrorLog(warn)
        self.needs_rows = reward_config is not None and reward_config.needs_rows
        self.loop = asyncio.new_event_loop()
        init = {"initializer": preload, "initargs": (self.config_json,)} if reward_config is not None else {}
        self.pool = ScoringPool(ScoringPoolConfig(workers=workers, timeout_s=timeout_s, memory_mb=memory_mb, **init))
        self.loop.run_until_complete(self.pool.start())

    def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        async def one(x: RewardInput) -> RewardResult:
            result = await self.pool.score(score_in_worker, self.task_name, self.kwargs_json, self.config_json, x)
            if result.error is not None and result.error.startswith(_POOL_OUTCOMES):  # killed, died, never started
                return result.model_copy(update={"error": f"scoring process: {result.error}"})
            return result

        async def all_of() -> list[RewardResult]:
            return list(await asyncio.gather(*(one(x) for x in inputs)))

        return self.loop.run_until_complete(all_of())

    def __call__(self, batch: list[Trajectory]) -> None:
        score_batch(self, batch)

    def close(self) -> None:
        self.loop.run_until_complete(self.pool.close())
        self.loop.close()


def build_scorer(
    cfg: Any, task: Task, *, pool: bool = False, workers: int | None = None, warn: Callable[[str], None] | None = None
) -> Scorer:
    """The run's scorer (`cfg`: a TrainConfig): the scoring processes when `pool` (the `stare reward` role)
    or when the reward has a function of the user's own; else this process."""
    reward: RewardConfig | None = cfg.reward
    if not pool and (reward is None or not reward.functions):
        return InProcessScorer(task, reward, warn)
    scoring = reward.scoring if reward is not None else None
    return PoolScorer(
        cfg.task.name,
        cfg.task.verifier_kwargs(),
        workers if workers is not None else (scoring.workers if scoring is not None else 1),
        timeout_s=scoring.timeout_s if scoring is not None else POOL_TIMEOUT_S,
        reward_config=reward,
        memory_mb=scoring.memory_mb if scoring is not None else None,
        warn=warn,
    )


def scorer_judge(scorer: Scorer) -> Judge:
    """The held-out evaluation's judge (stare.evaluation.heldout.Judge) from a run's scorer: held-out
    responses are scored, counted and logged as training ones are (and as the reward workers score a
    distributed run's evaluation)."""

    def judge(items: list[tuple[Problem, str, list[int]]], version: int) -> list[Judgement]:
        inputs = [problem_input(p, text, ids, version) for p, text, ids in items]
        out = []
        for x, result in zip(inputs, scorer.score(inputs), strict=True):
            scorer.errors(result, x, "held-out")
            out.append(Judgement(bool(reward_info(result, "")["correct"]), float(result.reward), result.error))
        return out

    return judge
