"""Code verifier: run a model-written Python program against tests in the sandbox.

Two kinds of tests (a task may mix them):
- `IOTest(stdin, expected_stdout)`: the program runs with `stdin`; it passes if its stdout equals
  `expected_stdout` up to trailing whitespace on each line and trailing blank lines (APPS,
  CodeContests, LiveCodeBench style).
- `AssertTest(code)`: statements run after the program in the program's namespace, e.g.
  `assert add(2, 3) == 5` (MBPP, HumanEval style). The program is executed as module `solution`
  (so its `if __name__ == "__main__":` block does not run), then the test; it passes only if the
  harness then prints a per-run random marker and exits 0, so `sys.exit(0)` or `os._exit(0)`
  inside the program does not pass a test it never ran.

`mode="fraction"` scores passed/total (one sandbox run per test); `mode="all"` scores 1.0 only if
every test passes (assert tests share one run; stops at the first failing test).

Not covered: a program that reads its own harness (the marker is in /work/main.py) can forge a
pass: the marker stops accidental exits, not a program written to cheat the checker. Output
comparison is exact text (no float tolerance, no "any valid answer" checkers).
"""

from __future__ import annotations

import re
import secrets

from pydantic import BaseModel, ConfigDict, Field

from reward.verifiers.registry import need, register_verifier
from stare.config.reward import CodeConfig
from stare.sandbox import ProcessSandbox, Sandbox, SandboxResult

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_HARNESS = """\
import sys as _sys
_ns = {{"__name__": "solution", "__builtins__": __builtins__}}
exec(compile(open("solution.py").read(), "solution.py", "exec"), _ns)
{tests}
_sys.stdout.flush()
_sys.stdout.write("\\n{marker}\\n")
"""
_RUN_TEST = 'exec(compile(open("test_{i}.py").read(), "test_{i}.py", "exec"), _ns)'


class IOTest(BaseModel):
    """Feed `stdin`, expect `expected_stdout` (trailing whitespace ignored)."""

    model_config = ConfigDict(frozen=True)

    stdin: str = ""
    expected_stdout: str


class AssertTest(BaseModel):
    """Python statements run after the program, in its namespace; passing means no exception."""

    model_config = ConfigDict(frozen=True)

    code: str = Field(min_length=1)


class CodeTests(BaseModel):
    """A task's tests; at least one of `io` and `asserts` must be non-empty."""

    model_config = ConfigDict(frozen=True)

    io: tuple[IOTest, ...] = ()
    asserts: tuple[AssertTest, ...] = ()

    @property
    def total(self) -> int:
        return len(self.io) + len(self.asserts)


class CodeCheck(BaseModel):
    """Outcome: tests passed out of total, the score, and the first failures (short)."""

    model_config = ConfigDict(frozen=True)

    passed: int
    total: int
    score: float
    failures: tuple[str, ...] = ()
    sandbox_error: str | None = None
    """Set when the sandbox itself failed: the score then says nothing about the program."""


def extract_code(response: str) -> str | None:
    """The last fenced code block (```python, ```py or bare ```) in `response`, or None."""
    blocks = _FENCE.findall(response)
    return blocks[-1] if blocks else None


def _normalize(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).rstrip()


def _why(result: SandboxResult) -> str:
    if result.status == "error":
        lines = result.stderr.strip().splitlines()
        return f"error: {lines[-1][:200] if lines else 'exit code ' + str(result.exit_code)}"
    return result.status + (f" ({result.limit_fired})" if result.limit_fired else "")


def _run_asserts(program: str, tests: tuple[AssertTest, ...], sandbox: Sandbox) -> SandboxResult:
    marker = secrets.token_hex(16)
    files = {"solution.py": program}
    files.update({f"test_{i}.py": t.code for i, t in enumerate(tests)})
    runs = "\n".join(_RUN_TEST.format(i=i) for i in range(len(tests)))
    result = sandbox.run(_HARNESS.format(tests=runs, marker=marker), files=files)
    if result.status == "ok" and result.stdout.rstrip("\n").rsplit("\n", 1)[-1] != marker:
        return result.model_copy(
            update={"status": "error", "stderr": result.stderr + "\n[harness] exited before the tests finished"}
        )
    return result


def run_tests(program: str, tests: CodeTests, sandbox: Sandbox, config: CodeConfig | None = None) -> CodeCheck:
    """Run `program` against `tests` in `sandbox`; never raises for what the program does."""
    config = config or CodeConfig()
    if tests.total == 0:
        raise ValueError("tests: no io or assert tests; a task needs at least one")
    passed, failures = 0, []
    stop_early = config.mode == "all"

    def record(ok: bool, label: str, result: SandboxResult) -> CodeCheck | None:
        nonlocal passed
        if result.status == "sandbox_error":
            return CodeCheck(
                passed=passed, total=tests.total, score=0.0, failures=tuple(failures), sandbox_error=result.detail
            )
        if ok:
            passed += 1
        elif len(failures) < 5:
            failures.append(f"{label}: {_why(result) if not result.ok else 'wrong output'}")
        return None

    for i, test in enumerate(tests.io):
        result = sandbox.run(program, stdin=test.stdin)
        ok = result.ok and _normalize(result.stdout) == _normalize(test.expected_stdout)
        if (early := record(ok, f"io[{i}]", result)) is not None:
            return early
        if stop_early and not ok:
            return CodeCheck(passed=passed, total=tests.total, score=0.0, failures=tuple(failures))
    if stop_early and tests.asserts:
        result = _run_asserts(program, tests.asserts, sandbox)
        if (early := record(result.ok, "asserts", result)) is not None:
            return early
        passed += len(tests.asserts) - 1 if result.ok else 0
    else:
        for i, test in enumerate(tests.asserts):
            result = _run_asserts(program, (test,), sandbox)
            if (early := record(result.ok, f"asserts[{i}]", result)) is not None:
                return early
    score = passed / tests.total
    if stop_early:
        score = 1.0 if passed == tests.total else 0.0
    return CodeCheck(passed=passed, total=tests.total, score=score, failures=tuple(failures))


def check_code(
    response: str, tests: CodeTests, sandbox: Sandbox | None = None, config: CodeConfig | None = None
) -> CodeCheck:
    """Extract the program from `response` (see CodeConfig.extract_code) and run the tests.

    With `sandbox=None` a `ProcessSandbox(config.sandbox)` is built (raises SandboxUnavailable
    where its isolation cannot work).
    """
    config = config or CodeConfig()
    program = extract_code(response) if config.extract_code else response
    if program is None or not program.strip():
        return CodeCheck(passed=0, total=tests.total, score=0.0, failures=("no ```python code block in the response",))
    return run_tests(program, tests, sandbox or ProcessSandbox(config.sandbox), config)


def code_reward(
    response: str, tests: CodeTests, sandbox: Sandbox | None = None, config: CodeConfig | None = None
) -> float:
    """The score of `check_code` (raises RuntimeError if the sandbox itself failed)."""
    check = check_code(response, tests, sandbox, config)
    if check.sandbox_error is not None:
        raise RuntimeError(f"sandbox failed, the program was not judged: {check.sandbox_error}")
    return check.score


@register_verifier("code")
def score_code(c, x, context) -> float:
    check = check_code(x.response, need(x.tests, "tests", "code"), context.sandbox, c.config)
    if check.sandbox_error is not None:
        raise RuntimeError(f"sandbox failed: {check.sandbox_error}")
    return check.score
