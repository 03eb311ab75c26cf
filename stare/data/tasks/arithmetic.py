"""Multi-step integer arithmetic with a short chain of thought: the bundled task for the CPU demo.

A prompt is an expression ending in "=", such as "3+5*2=". The reference completion evaluates it
one binary operation per step (multiplication first, then left to right) and ends with "#" and the
final answer:

    prompt      "3+5*2-4="
    completion  "5*2=10;3+10=13;13-4=9;#9"

The operands of a '+' or '*' step may be written in either order ("2*5=10;10+3=13;..." is just as
right); `solution(problem, rng)` draws such variants for supervised warm starts.

Only the integer right after the first "#" is graded. The alphabet is "0123456789+-*=;#", so a
character-level tokenizer of about twenty symbols covers prompts and completions.

Levels (number of operands, largest operand; at most one "*" per expression, so numbers stay short):
    1: a op b            operands 0..9    one step
    2: a op b op c       operands 0..9    two steps
    3: a op b op c       operands 0..19   two steps
    4: a op b op c op d  operands 0..9    three steps

Splits: a prompt is in the test split iff the SHA-256 of its text falls in a fixed 1/5 bucket, so
the splits are disjoint and stable across seeds and versions. Within a split, problems are drawn
with a seeded RNG, levels in rotation; a call returns distinct prompts until a level's share of the
split runs out (level 1 has about 60 test and 240 train prompts), then repeats that level's prompts.

Not covered: division, parentheses, numbers with more than two digits in the prompt.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence

from stare.data.tasks.base import Problem, Split, Task, check_split

ALPHABET = "0123456789+-*=;#"
"""Every character a prompt or a reference completion can contain."""

LEVELS: dict[int, tuple[int, int]] = {1: (2, 9), 2: (3, 9), 3: (3, 19), 4: (4, 9)}
"""level -> (number of operands, largest operand)."""

_TEST_BUCKETS = 5  # 1 in 5 prompts is a test prompt
_ANSWER_RE = re.compile(r"#(-?[0-9]+)")
_MAX_ANSWER_DIGITS = 18  # longer digit runs are garbage, not answers
_UNIQUE_TRIES = 100  # draws spent looking for an unseen prompt before allowing repeats


def _is_test(prompt: str) -> bool:
    digest = hashlib.sha256(prompt.encode()).digest()
    return int.from_bytes(digest[:8], "big") % _TEST_BUCKETS == 0


def _steps(nums: Sequence[int], ops: Sequence[str]) -> list[tuple[int, str, int, int]]:
    """The (x, op, y, x op y) steps that evaluate the expression: '*' first, then left to right."""
    nums, ops = list(nums), list(ops)
    steps = []
    while "*" in ops:
        i = ops.index("*")
        z = nums[i] * nums[i + 1]
        steps.append((nums[i], "*", nums[i + 1], z))
        nums[i : i + 2] = [z]
        del ops[i]
    while ops:
        x, op, y = nums[0], ops[0], nums[1]
        z = x + y if op == "+" else x - y
        steps.append((x, op, y, z))
        nums[0:2] = [z]
        del ops[0]
    return steps


def _parse(prompt: str) -> tuple[list[int], list[str]]:
    body = prompt.removesuffix("=")
    tokens = re.findall(r"\d+|[+\-*]", body)
    return [int(t) for t in tokens[0::2]], tokens[1::2]


class ArithmeticTask:
    """Multi-step arithmetic with a chain of thought; see the module docstring for the format."""

    name = "arithmetic"
    data_source = "stare/arithmetic"
    alphabet = ALPHABET

    def __init__(self, levels: Sequence[int] = (1, 2, 3, 4)) -> None:
        unknown = sorted(set(levels) - set(LEVELS))
        if not levels or unknown:
            raise ValueError(f"levels must be a non-empty subset of {sorted(LEVELS)}, got {list(levels)}")
        self.levels = tuple(levels)

    def _draw(self, rng: random.Random, level: int) -> str:
        n_operands, top = LEVELS[level]
        nums = [rng.randint(0, top) for _ in range(n_operands)]
        ops = [rng.choice("+-") for _ in range(n_operands - 1)]
        if rng.random() < 0.5:  # at most one '*', at a random position
            ops[rng.randrange(len(ops))] = "*"
        body = "".join(f"{a}{op}" for a, op in zip(nums, ops)) + str(nums[-1])
        return body + "="

    def _draw_in_split(self, rng: random.Random, level: int, want_test: bool) -> str:
        while True:  # about 1 in 5 draws is a test prompt, so this ends quickly
            prompt = self._draw(rng, level)
            if _is_test(prompt) == want_test:
                return prompt

    def _problem(self, prompt: str, level: int) -> Problem:
        digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
        return Problem(
            prompt=prompt,
            answer=str(_steps(*_parse(prompt))[-1][3]),
            problem_id=f"arithmetic-L{level}-{digest}",
            level=level,
            data_source=self.data_source,
        )

    def problems(self, split: Split, n: int, seed: int) -> list[Problem]:
        """`n` problems from `split`, deterministic in (split, n, seed, levels)."""
        check_split(split, n)
        want_test = split == "test"
        rng = random.Random(f"arithmetic/{split}/{seed}")
        seen: set[str] = set()
        exhausted: set[int] = set()  # levels whose split ran out of unseen prompts
        out = []
        for i in range(n):
            level = self.levels[i % len(self.levels)]
            for _ in range(_UNIQUE_TRIES):
                prompt = self._draw_in_split(rng, level, want_test)
                if prompt not in seen or level in exhausted:
                    break
            else:  # no unseen prompt found: allow repeats at this level from now on
                exhausted.add(level)
            seen.add(prompt)
            out.append(self._problem(prompt, level))
        return out

    def solution(self, problem: Problem, rng: random.Random | None = None) -> str:
        """A correct chain of thought and final answer for `problem` (no end token).

        Without `rng`, the canonical one. With `rng`, each '+' or '*' step whose left operand is
        not negative writes its operands in either order ("5*2=10" or "2*5=10"), chosen by `rng`:
        equally correct paths, so a policy trained on them keeps some harmless entropy.
        """
        steps = _steps(*_parse(problem.prompt))
        parts = []
        for x, op, y, z in steps:
            if rng is not None and op in "+*" and x >= 0 and rng.random() < 0.5:
                x, y = y, x
            parts.append(f"{x}{op}{y}={z};")
        return "".join(parts) + f"#{steps[-1][3]}"

    def extract_answer(self, completion: str) -> str | None:
        """The integer after the first '#', canonicalised ("#007" -> "7"), or None."""
        return hash_answer(completion) if isinstance(completion, str) else None

    def reward(self, problem: Problem, completion: str) -> float:
        """1.0 if the final answer equals `problem.answer`, else 0.0; never raises."""
        return exact_answer_reward(self, problem, completion)


def hash_answer(text: str) -> str | None:
    """The integer after the first '#' in `text`, canonicalised ("#007" -> "7"), or None."""
    match = _ANSWER_RE.search(text)
    if match is None or len(match.group(1).lstrip("-")) > _MAX_ANSWER_DIGITS:
        return None
    return str(int(match.group(1)))


def exact_answer_reward(task: Task, problem: Problem, completion: str) -> float:
    """1.0 if `task.extract_answer(completion)` equals `problem.answer`, else 0.0; never raises."""
    try:
        return 1.0 if task.extract_answer(completion) == problem.answer else 0.0
    except Exception:  # the reward must survive any policy output
        return 0.0
