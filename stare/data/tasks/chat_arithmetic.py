"""Chat-formatted arithmetic with `\\boxed{}` answers: the task for a real instruct model on CPU.

A problem is a one-shot chat: an example exchange ("What is 2 + 3? ..." -> "2 + 3 = 5. The answer
is \\boxed{5}."), then the question, rendered with the tokenizer's chat template and the
assistant's generation prompt. The reward is the math verifier's (`stare.data.tasks.math_verify`:
math-verify equivalence of the last `\\boxed{}`), the same code that scores DAPO-Math.

Levels (all operands positive):
    1: a + b     a, b in 1..9              (81 prompts)
    2: a + b     a in 10..39, b in 1..9    (270 prompts)
    3: a - b     a in 10..39, b in 1..9    (270 prompts)

SmolLM2-135M-Instruct (Q4_1, dequantized) samples level 1 right about 60% of the time at
temperature 1.0 and level 2-3 less: groups of 4 have reward variance to learn from.

Splits: a question is in the test split iff the SHA-256 of its text falls in a fixed 1/5 bucket.
Within a split, problems are drawn with a seeded RNG, levels in rotation (repeats once a level's
share runs out).

Not covered: multi-step word problems (GSM8K-style data is not shipped; use `task.name: dataset`
with a local file for those).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from stare.data.tasks.base import Problem, Split, chat_prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

LEVELS: dict[int, tuple[str, range, range]] = {
    1: ("+", range(1, 10), range(1, 10)),
    2: ("+", range(10, 40), range(1, 10)),
    3: ("-", range(10, 40), range(1, 10)),
}
INSTRUCTION = "Put the final answer in \\boxed{}."
EXAMPLE = [
    {"role": "user", "content": f"What is 2 + 3? {INSTRUCTION}"},
    {"role": "assistant", "content": "2 + 3 = 5. The answer is \\boxed{5}."},
]
_TEST_BUCKETS = 5


def question(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}? {INSTRUCTION}"


def _is_test(text: str) -> bool:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % _TEST_BUCKETS == 0


class ChatArithmeticTask:
    """See the module docstring. `tokenizer` must have a chat template; None builds a task that only
    scores (the reward role's), whose `problems` raises."""

    name = "chat-arithmetic"
    data_source = "stare/chat-arithmetic"

    def __init__(self, tokenizer: PreTrainedTokenizerBase | None = None, levels: Sequence[int] = (1, 2, 3)) -> None:
        if tokenizer is not None and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "task chat-arithmetic needs a tokenizer with a chat template (a real instruct model: "
                "model.source=smollm2 or model.path)"
            )
        unknown = sorted(set(levels) - set(LEVELS))
        if not levels or unknown:
            raise ValueError(f"levels must be a non-empty subset of {sorted(LEVELS)}, got {list(levels)}")
        self.tokenizer = tokenizer
        self.levels = tuple(levels)
        self._pools: dict[tuple[int, bool], list[tuple[int, str, int]]] = {}
        for level in self.levels:
            op, left, right = LEVELS[level]
            for want_test in (False, True):
                self._pools[level, want_test] = [
                    (a, op, b) for a in left for b in right if _is_test(question(a, op, b)) == want_test
                ]

    def _problem(self, a: int, op: str, b: int, level: int) -> Problem:
        if self.tokenizer is None:
            raise ValueError("chat-arithmetic problems need the model's tokenizer (its chat template)")
        text = question(a, op, b)
        prompt = chat_prompt(self.tokenizer, EXAMPLE + [{"role": "user", "content": text}])
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        answer = a + b if op == "+" else a - b
        return Problem(
            prompt=prompt,
            answer=str(answer),
            problem_id=f"chat-arithmetic-L{level}-{digest}",
            level=level,
            data_source=self.data_source,
        )

    def problems(self, split: Split, n: int, seed: int) -> list[Problem]:
        """`n` problems from `split`, deterministic in (split, n, seed, levels)."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = random.Random(f"chat-arithmetic/{split}/{seed}")
        orders = {
            level: rng.sample(self._pools[level, split == "test"], len(self._pools[level, split == "test"]))
            for level in self.levels
        }
        out = []
        for i in range(n):
            level = self.levels[i % len(self.levels)]
            order = orders[level]
            a, op, b = order[(i // len(self.levels)) % len(order)]
            out.append(self._problem(a, op, b, level))
        return out

    def extract_answer(self, completion: str) -> str | None:
        from stare.data.tasks.math_verify import MathConfig, extract_answer

        return extract_answer(completion, MathConfig().extract_from)

    def reward(self, problem: Problem, completion: str) -> float:
        """1.0 if the last boxed answer equals `problem.answer` (math-verify), else 0.0; never raises."""
        from stare.data.tasks.math_verify import math_reward

        try:
            return math_reward(completion, problem.answer)
        except Exception:  # the reward must survive any policy output
            return 0.0
