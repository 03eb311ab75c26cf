"""The prompt stream: a deterministic, resumable cursor over a task's training problems.

Problems are drawn from a fixed pool (`pool_size` problems from the task's train split) in an
order reshuffled every epoch from (seed, epoch); `cursor` counts prompts handed out, so a restored
cursor continues the exact same sequence. With `max_prompt_len` the pool goes through the prompt
length policy (stare.data.prompt_policy) once, when the feeder is built.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from stare.data.prompt_policy import Overflow, fit_prompts, prompt_ids
from stare.data.tasks.base import Problem, Task
from stare.transport.records import PromptTask


class PromptFeeder:
    def __init__(
        self,
        task: Task,
        tokenizer,
        *,
        run_id: str,
        group_size: int,
        seed: int,
        pool_size: int = 20_000,
        max_prompt_len: int | None = None,
        prompt_overflow: Overflow = "truncate_left",
        log: Callable[[str], None] = print,
    ):
        self.task = task
        self.tokenizer = tokenizer
        self.run_id = run_id
        self.group_size = group_size
        self.seed = seed
        self.pool: list[Problem] = fit_prompts(
            task.problems("train", pool_size, seed),
            tokenizer,
            max_prompt_len,
            prompt_overflow,
            what="training prompts",
            log=log,
        )
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

    def next_tasks(self, n: int) -> list[PromptTask]:
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

    def state_dict(self) -> dict:
        return {"cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.cursor = int(state["cursor"])


def build_feeder(cfg, task: Task, tokenizer, log: Callable[[str], None] = print) -> PromptFeeder:
    """The run's feeder from its config (`cfg`: a stare.config.TrainConfig)."""
    return PromptFeeder(
        task,
        tokenizer,
        run_id=cfg.run.name,
        group_size=cfg.rollout.samples_per_prompt,
        seed=cfg.run.seed,
        max_prompt_len=cfg.data.max_prompt_len,
        prompt_overflow=cfg.data.prompt_overflow,
        log=log,
    )


def eval_problems(
    cfg, task: Task, tokenizer, log: Callable[[str], None] = print, max_model_len: int | None = None
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
