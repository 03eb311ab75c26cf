"""Multiply big numbers, with a Python tool: the bundled task for multi-turn tool use.

A prompt is a product of two 3-4 digit numbers, "1234*567=". A tiny model cannot multiply those
in its head, but it can delegate: the reference solution writes a Hermes-style tool call, the
rollout's `ToolAgent` runs the code in the sandbox and shows the output, and the model copies it
into the final answer after "#":

    prompt       "1234*567="
    turn 1       <tool_call>{"name": "code_interpreter", "arguments": {"code": "print(1234*567)"}}</tool_call>
    observation  <tool_response>699678</tool_response>          (written by the agent; not trained on)
    turn 2       #699678<eos>

`solution(problem, rng)` with an `rng` writes, with probability `direct_fraction`, a direct answer
("#699678") instead: the reference is right either way, but a model cannot learn the direct one,
so the warm-started policy calls the tool only part of the time and is right mostly when it does.
RL then has something to find: calling the tool pays. Without `rng` the solution is the tool call.
`solution_segments` returns the same text split into (text, trained) parts, so the warm start
masks the observation out of its loss exactly as RL does.

Only the integer after the first "#" that follows the last `</tool_response>` (or anywhere, when
there is no tool response) is graded: a number the tool printed is not an answer until the model
writes it, and a program that prints "#699678" earns nothing by itself.

Tokens: the tags and the fixed JSON head `{"name": "code_interpreter", "arguments": {"code": "`
are single tokens of the tiny tokenizer (`whole_tokens`, like BPE merges of frequent strings);
the code itself is character by character, over `alphabet`.

Levels (digits of the two factors): 1: 3 x 2, 2: 3 x 3, 3: 4 x 3, 4: 4 x 4. Splits as in the
arithmetic task: a prompt is a test prompt iff the SHA-256 of its text falls in a fixed 1/5
bucket.

`warm_start_sandbox()` is an exact in-memory stand-in for the `ProcessSandbox` on the programs
this task's solutions write (`print(A*B)` of integer literals, evaluated with `ast`, no `eval`);
anything else gets the error a failed run would show. The tiny-model build evaluates with it (a
warm start checks accuracy often; real sandbox runs cost ~0.2 s each); RL runs the real sandbox.

Not covered: other operations, negative numbers, several tool calls per problem.
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import string
from typing import TYPE_CHECKING

from stare.data.tasks.arithmetic import exact_answer_reward, hash_answer
from stare.data.tasks.base import Problem, Split, check_split

if TYPE_CHECKING:
    from stare.sandbox import InMemorySandbox, SandboxResult

LEVELS: dict[int, tuple[int, int]] = {1: (3, 2), 2: (3, 3), 3: (4, 3), 4: (4, 4)}
"""level -> (digits of the first factor, digits of the second)."""

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
CALL_HEAD = json.dumps({"name": "code_interpreter", "arguments": {"code": ""}})[:-3]  # ... {"code": "
CALL_TAIL = '"}}'

ALPHABET = string.ascii_letters + string.digits + " +-*/=#;:.,'\"()[]{}_<>!?\n"
"""Characters of prompts, solutions and the error observations the model may see."""

_TEST_BUCKETS = 5
_UNIQUE_TRIES = 100


def _is_test(prompt: str) -> bool:
    digest = hashlib.sha256(prompt.encode()).digest()
    return int.from_bytes(digest[:8], "big") % _TEST_BUCKETS == 0


def _factors(prompt: str) -> tuple[int, int]:
    a, b = prompt.removesuffix("=").split("*")
    return int(a), int(b)


class ToolArithmeticTask:
    """Big products, solved by calling a Python tool; see the module docstring."""

    name = "tool-arithmetic"
    data_source = "stare/tool-arithmetic"
    alphabet = ALPHABET
    whole_tokens = (TOOL_OPEN, TOOL_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE, CALL_HEAD)
    build_version = 1  # part of the tiny-model cache key: bump when solutions or format change

    def __init__(self, levels: tuple[int, ...] = (1, 2, 3, 4), direct_fraction: float = 0.5) -> None:
        unknown = sorted(set(levels) - set(LEVELS))
        if not levels or unknown:
            raise ValueError(f"levels must be a non-empty subset of {sorted(LEVELS)}, got {list(levels)}")
        if not 0.0 <= direct_fraction <= 1.0:
            raise ValueError(f"direct_fraction must be in [0, 1], got {direct_fraction}")
        self.levels = tuple(levels)
        self.direct_fraction = direct_fraction

    def _draw(self, rng: random.Random, level: int) -> str:
        da, db = LEVELS[level]
        a = rng.randint(10 ** (da - 1), 10**da - 1)
        b = rng.randint(10 ** (db - 1), 10**db - 1)
        return f"{a}*{b}="

    def problems(self, split: Split, n: int, seed: int) -> list[Problem]:
        """`n` problems from `split`, deterministic in (split, n, seed, levels), distinct while
        the level's share of the split lasts (it is large: 10^5+ prompts per level)."""
        check_split(split, n)
        want_test = split == "test"
        rng = random.Random(f"tool-arithmetic/{split}/{seed}")
        seen: set[str] = set()
        out = []
        for i in range(n):
            level = self.levels[i % len(self.levels)]
            for _ in range(_UNIQUE_TRIES):
                prompt = self._draw(rng, level)
                if _is_test(prompt) == want_test and prompt not in seen:
                    break
            seen.add(prompt)
            a, b = _factors(prompt)
            digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
            out.append(
                Problem(
                    prompt=prompt,
                    answer=str(a * b),
                    problem_id=f"tool-arithmetic-L{level}-{digest}",
                    level=level,
                    data_source=self.data_source,
                )
            )
        return out

    def solution_segments(self, problem: Problem, rng: random.Random | None = None) -> list[tuple[str, bool]]:
        """The reference solution as (text, trained) parts: the tool call, the observation the
        agent will show (not trained), the answer. A direct answer with probability
        `direct_fraction` when `rng` is given."""
        a, b = _factors(problem.prompt)
        if rng is not None and rng.random() < self.direct_fraction:
            return [(f"#{a * b}", True)]
        code = f"print({a}*{b})"
        observation = f"{RESPONSE_OPEN}{a * b}{RESPONSE_CLOSE}"  # = ToolAgent's rendering of the run
        return [
            (f"{TOOL_OPEN}{CALL_HEAD}{code}{CALL_TAIL}{TOOL_CLOSE}", True),
            (observation, False),
            (f"#{a * b}", True),
        ]

    def solution(self, problem: Problem, rng: random.Random | None = None) -> str:
        """The reference solution as one string, observation included (see `solution_segments`)."""
        return "".join(text for text, _ in self.solution_segments(problem, rng))

    def extract_answer(self, completion: str) -> str | None:
        """The integer after the first '#' that follows the last tool response, canonicalised."""
        if not isinstance(completion, str):
            return None
        return hash_answer(completion.rsplit(RESPONSE_CLOSE, 1)[-1])

    def reward(self, problem: Problem, completion: str) -> float:
        """1.0 if the final answer equals `problem.answer`, else 0.0; never raises."""
        return exact_answer_reward(self, problem, completion)

    def warm_start_sandbox(self) -> InMemorySandbox:
        """An in-memory `Sandbox` that answers `print(A*B)` exactly as the real one would."""
        from stare.sandbox import InMemorySandbox

        return InMemorySandbox(lambda code, stdin: simulate_product_program(code))


def simulate_product_program(code: str) -> SandboxResult:
    """The `SandboxResult` of running `code` when it is `print(<int>*<int>)` (spaces allowed);
    any other program gets an "error" result like a failed run (the build never runs it)."""
    from stare.sandbox import SandboxResult

    product = _printed_product(code)
    if product is None:
        return SandboxResult(
            status="error", exit_code=1, stderr="SimulationError: the warm-start sandbox only runs print(A*B)\n"
        )
    return SandboxResult(status="ok", exit_code=0, stdout=f"{product}\n")


def _printed_product(code: str) -> int | None:
    """A*B when `code` is `print(<int>*<int>)` (spaces allowed), else None."""
    try:
        call = ast.parse(code.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id == "print"
        and len(call.args) == 1
        and not call.keywords
    ):
        return None
    product = call.args[0]
    if not (isinstance(product, ast.BinOp) and isinstance(product.op, ast.Mult)):
        return None
    left, right = product.left, product.right
    if not (isinstance(left, ast.Constant) and isinstance(right, ast.Constant)):
        return None
    if type(left.value) is not int or type(right.value) is not int:
        return None
    return left.value * right.value
