"""The prompt stream: a deterministic, resumable cursor over a task's training problems.

Problems are drawn from a fixed pool in an order reshuffled every epoch from (seed, epoch); `cursor`
counts prompts handed out, so a restored cursor continues the exact same sequence. With
`max_prompt_len` the pool goes through the prompt length policy (stare.data.prompt_policy) once, when
the feeder is built.

The pool (`data.max_prompts`): every training problem of a task of fixed size (a dataset file, however
large: `task.size("train")`), or GENERATED_POOL draws from a generated task (the bundled arithmetic
tasks, which have none); `pool_size` cuts either to its first N in the seeded order, said in the log.
The pool's size is always logged. `epochs` (`data.epochs`): at most epochs x pool prompts are handed
out, then `exhausted`; None: the pool is cycled without end.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stare.data.prompt_policy import Overflow, fit_prompts, prompt_ids
from stare.data.tasks.base import Problem, Task
from stare.transport.records import PromptTask

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from stare.config import TrainConfig

GENERATED_POOL = 20_000
"""Training problems drawn from a generated task (no fixed size) when data.max_prompts does not say."""


def task_size(task: Task, split: str) -> int | None:
    """How many problems `split` of `task` holds; None for a generated task (no `size` method)."""
    size = getattr(task, "size", None)
    return None if size is None else int(size(split))


class PromptFeeder:
    def __init__(
        self,
        task: Task,
        tokenizer: Any,
        *,
        run_id: str,
        group_size: int,
        seed: int,
        pool_size: int | None = None,
        epochs: int | None = None,
        max_prompt_len: int | None = None,
        prompt_overflow: Overflow = "truncate_left",
        log: Callable[[str], None] = print,
    ) -> None:
        self.task = task
        self.tokenizer = tokenizer
        self.run_id = run_id
        self.group_size = group_size
        self.seed = seed
        size = task_size(task, "train")
        n = pool_size if pool_size is not None else (size if size is not None else GENERATED_POOL)
        if size is not None and n < size:
            log(
                f"data.max_prompts={n:,}: training on {n:,} of the task's {size:,} training prompts (the first "
                f"{n:,} of the run's seeded order; the rest are not used)"
            )
        self.pool: list[Problem] = fit_prompts(
            task.problems("train", n, seed),
            tokenizer,
            max_prompt_len,
            prompt_overflow,
            what="training prompts",
            log=log,
        )
        if not self.pool:
            from stare.config import ConfigError

            raise ConfigError(
                "training prompts: none to train on (the task has none, or data.max_prompt_len with "
                "data.prompt_overflow=reject rejected every one)"
            )
        if size is None:
            whole = "drawn from the generated task"
        else:
            whole = "the task's every training prompt" if len(self.pool) == size else f"of the task's {size:,}"
        log(
            f"training pool: {len(self.pool):,} prompts ({whole})"
            + (f", {epochs} epoch(s): {epochs * len(self.pool):,} prompts in all" if epochs is not None else "")
        )
        self.limit = None if epochs is None else epochs * len(self.pool)  # prompts handed out at most
        self.coverage: dict[str, float] = {}  # the tokenizer's coverage of the pool (`check_coverage`)
        self.cursor = 0
        self._order_epoch = -1
        self._order: list[int] = []

    def _index(self, cursor: int) -> int:
        epoch, pos = divmod(cursor, len(self.pool))
        if epoch != self._order_epoch:
            self._order = list(range(len(self.pool)))
            random.Random(self.seed * 7919 + epoch).shuffle(self._order)
            self._order_epoch = epoch
        return self._order[pos]

    @property
    def exhausted(self) -> bool:
        """Every prompt of data.epochs has been handed out."""
        return self.limit is not None and self.cursor >= self.limit

    def next_tasks(self, n: int) -> list[PromptTask]:
        """The next `n` prompts (fewer, or none, once data.epochs' prompts are handed out)."""
        if self.limit is not None:
            n = max(min(n, self.limit - self.cursor), 0)
        out = [self.task_at(self.cursor + i) for i in range(n)]
        self.cursor += n
        return out

    def task_at(self, cursor: int) -> PromptTask:
        """The task published at `cursor` (group g<cursor>), the same whenever asked: a learner re-issues a
        published group that was lost (learner/loop/lost_groups.py)."""
        problem = self.pool[self._index(cursor)]
        return PromptTask(
            run_id=self.run_id,
            group_id=f"g{cursor:09d}",
            prompt=problem.prompt,
            prompt_token_ids=prompt_ids(problem, self.tokenizer),
            answer=problem.answer,
            problem_id=problem.problem_id,
            data_source=problem.data_source,
            group_size=self.group_size,
            level=problem.level,
            cursor=cursor,
            extra_info=problem.extra_info,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor = int(state["cursor"])


def build_feeder(cfg: TrainConfig, task: Task, tokenizer: Any, log: Callable[[str], None] = print) -> PromptFeeder:
    """The run's feeder from its config (`cfg`: a stare.config.TrainConfig); warns when the tokenizer does not
    cover its prompts (`check_coverage`)."""
    feeder = PromptFeeder(
        task,
        tokenizer,
        run_id=cfg.run.name,
        group_size=cfg.rollout.samples_per_prompt,
        seed=cfg.run.seed,
        pool_size=cfg.data.max_prompts,
        epochs=cfg.data.epochs,
        max_prompt_len=cfg.data.max_prompt_len,
        prompt_overflow=cfg.data.prompt_overflow,
        log=log,
    )
    check_coverage(feeder, cfg.logging.warn_unk_rate, log)
    return feeder


def run_steps(cfg: TrainConfig, feeder: PromptFeeder, log: Callable[[str], None] = print) -> int:
    """The run's length in steps: run.steps, or with run.steps null floor(data.epochs x pool / prompts_per_step)
    (at least 1: verl's len(dataloader) x total_epochs, a last partial batch dropped), said in the log. With both
    set the log says which ends the run first (data.epochs ends it when its prompts are used up)."""
    steps, per_step = cfg.run.steps, cfg.rollout.prompts_per_step
    if feeder.limit is None:
        assert steps is not None  # the config requires data.epochs with run.steps null
        return steps
    derived = max(feeder.limit // per_step, 1)
    what = f"data.epochs={cfg.data.epochs} over {len(feeder.pool):,} prompts at {per_step} per step"
    if steps is None:
        log(f"{what}: {derived:,} steps (run.steps)")
        return derived
    if steps < derived:
        log(f"{what} would be {derived:,} steps; run.steps={steps:,} ends the run first")
    elif steps > derived:
        log(f"{what}: at most {derived:,} steps; the data ends the run before run.steps={steps:,}")
    return steps


def check_coverage(feeder: PromptFeeder, limit: float, log: Callable[[str], None]) -> dict[str, float]:
    """How well the tokenizer covers (a seeded sample of) the training prompts (stare.observe.watch.prompt_coverage),
    said as a warning when its unknown-token share or its lost characters are above `limit`
    (logging.warn_unk_rate); kept as `feeder.coverage` (the session adds it to every step's metrics)."""
    from stare.observe.watch import COVERAGE_ADVICE, UNK_SAMPLE, prompt_coverage

    sample = random.Random(feeder.seed).sample(feeder.pool, min(UNK_SAMPLE, len(feeder.pool)))
    coverage = prompt_coverage([p.prompt for p in sample], feeder.tokenizer)
    unk, lost = coverage["unk_rate"], coverage["chars_lost"]
    if max(unk, lost) > limit:
        token = getattr(feeder.tokenizer, "unk_token", None) or "<unk>"
        log(
            f"warning: training prompts: {lost:.0%} of their characters are lost by the tokenizer ({unk:.0%} of the "
            f"tokens are its unknown token {token!r}, the rest of the unknown characters dropped): {COVERAGE_ADVICE} "
            f"(logging.warn_unk_rate={limit})"
        )
    feeder.coverage = {"data_unk_rate": unk, "data_chars_lost": lost}
    return coverage


def eval_problems(
    cfg: TrainConfig,
    task: Task,
    tokenizer: PreTrainedTokenizerBase,
    log: Callable[[str], None] = print,
    max_model_len: int | None = None,
) -> list[Problem]:
    """The run's held-out problems, through the same prompt length policy as training (with the
    engine's `max_model_len`: also its limit, what it leaves after rollout.max_new_tokens)."""
    seed = cfg.run.seed if cfg.task.eval_seed is None else cfg.task.eval_seed
    limit, name = cfg.data.max_prompt_len, "data.max_prompt_len"
    if max_model_len is not None and (limit is None or max_model_len - cfg.rollout.max_new_tokens < limit):
        limit = max_model_len - cfg.rollout.max_new_tokens
        name = "the engine's max_model_len minus rollout.max_new_tokens"
    return fit_prompts(
        task.problems("test", cfg.task.eval_problems, seed),
        tokenizer,
        limit,
        cfg.data.prompt_overflow,
        what="held-out prompts",
        log=log,
        limit_name=name,
    )
