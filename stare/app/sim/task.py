"""The task of `stare sim`: prompts of the configured length for the real `PromptFeeder` (`SimTask`,
`SimTokenizer`) and the reward worker's scorer seam (`solve_rate_scorer`: each prompt has a solve rate; the
real `GroupCollector` filters the groups whose rewards are all equal)."""

from __future__ import annotations

import random
from collections.abc import Callable

from stare.data.tasks.base import Problem


class SimTokenizer:
    pad_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1] * max(1, len(text.split()))

    def __call__(self, texts: list[str], add_special_tokens: bool = False) -> dict[str, list[list[int]]]:
        return {"input_ids": [self.encode(t) for t in texts]}

    def batch_decode(self, ids, skip_special_tokens: bool = True) -> list[str]:
        return [""] * len(ids)


class SimTask:
    """Problems with prompts of `prompt_len` tokens (+/- 25%) and a solve rate each, drawn from
    Beta(a, b): the answer field carries it to the scorer."""

    name = "sim"

    def __init__(self, prompt_len: int, solve_beta: tuple[float, float], seed: int, pool: int = 4096):
        self.prompt_len, self.solve_beta, self.pool, self.seed = prompt_len, solve_beta, pool, seed

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        rng = random.Random(seed * 31 + 7)
        out = []
        for i in range(min(n, self.pool)):
            length = max(1, int(self.prompt_len * rng.uniform(0.75, 1.25)))
            p = rng.betavariate(*self.solve_beta)
            out.append(
                Problem(
                    prompt="w " * length,
                    answer=f"{p:.6f}",
                    problem_id=f"sim-{i}",
                    level=1,
                    data_source="sim",
                    prompt_token_ids=[1] * length,
                )
            )
        return out

    def extract_answer(self, completion: str) -> str | None:
        return None

    def reward(self, problem: Problem, completion: str) -> float:
        return 0.0


def solve_rate_scorer(seed: int) -> Callable[[list], None]:
    """The reward worker's scorer seam: a sample is right with its prompt's solve rate."""

    def score(batch: list) -> None:
        for t in batch:
            rng = random.Random(f"{seed}:{t.trajectory_id}")
            right = rng.random() < float(t.answer)
            t.reward, t.reward_info = float(right), {"correct": right, "finish_reason": t.finish_reason}

    return score
