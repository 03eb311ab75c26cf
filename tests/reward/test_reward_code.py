"""Code verifier: programs against stdin/stdout and assert tests, in the real sandbox."""

import pytest

from reward.verifiers.code import (
    AssertTest,
    CodeConfig,
    CodeTests,
    IOTest,
    check_code,
    code_reward,
    extract_code,
    run_tests,
)
from stare.sandbox import InMemorySandbox, ProcessSandbox, SandboxConfig, SandboxResult, probe

ADD_IO = CodeTests(
    io=(
        IOTest(stdin="2 3\n", expected_stdout="5\n"),
        IOTest(stdin="10 -4\n", expected_stdout="6"),
        IOTest(stdin="0 0\n", expected_stdout="0\n"),
    )
)
ADD_ASSERTS = CodeTests(
    asserts=(
        AssertTest(code="assert add(2, 3) == 5"),
        AssertTest(code="assert add(-1, 1) == 0"),
        AssertTest(code="assert add(0, 0) == 0"),
    )
)


@pytest.fixture(scope="module")
def sandbox():
    isolation = "namespaces" if probe("namespaces") is None else "unprivileged"
    return ProcessSandbox(SandboxConfig(isolation=isolation, cpu_s=2, wall_s=10.0))


def _fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\n"


def test_correct_stdin_program_passes_every_io_test(sandbox):
    program = "a, b = map(int, input().split())\nprint(a + b)"
    assert code_reward(_fenced(program), ADD_IO, sandbox) == 1.0


def test_partly_correct_program_scores_the_fraction_passed(sandbox):
    program = "a, b = map(int, input().split())\nprint(a + b if a else 1)"  # fails 0 0 only
    check = check_code(_fenced(program), ADD_IO, sandbox)
    assert (check.passed, check.total, check.score) == (2, 3, pytest.approx(2 / 3))


def test_all_mode_gives_zero_unless_everything_passes(sandbox):
    program = "a, b = map(int, input().split())\nprint(a + b if a else 1)"
    assert code_reward(_fenced(program), ADD_IO, sandbox, CodeConfig(mode="all")) == 0.0


def test_correct_function_passes_assert_tests(sandbox):
    assert code_reward(_fenced("def add(a, b):\n    return a + b"), ADD_ASSERTS, sandbox) == 1.0


def test_all_mode_runs_assert_tests_together(sandbox):
    config = CodeConfig(mode="all")
    assert code_reward(_fenced("def add(a, b):\n    return a + b"), ADD_ASSERTS, sandbox, config) == 1.0


def test_exiting_early_does_not_pass_assert_tests(sandbox):
    program = "import os\ndef add(a, b):\n    return 0\nos._exit(0)"
    assert code_reward(_fenced(program), ADD_ASSERTS, sandbox) == 0.0


def test_main_block_of_the_program_does_not_run_under_assert_tests(sandbox):
    program = "def add(a, b):\n    return a + b\nif __name__ == '__main__':\n    input()"
    assert code_reward(_fenced(program), ADD_ASSERTS, sandbox) == 1.0


def test_program_that_hangs_fails_its_test_not_the_verifier(sandbox):
    tests = CodeTests(io=(IOTest(stdin="", expected_stdout="1"),))
    config = CodeConfig(sandbox=SandboxConfig(isolation=sandbox.config.isolation, cpu_s=1, wall_s=1.0))
    check = check_code(_fenced("import time\ntime.sleep(60)"), tests, ProcessSandbox(config.sandbox), config)
    assert (check.score, check.failures) == (0.0, ("io[0]: timeout (wall_s)",))


def test_missing_code_block_scores_zero_with_a_reason():
    check = check_code("I would write a loop.", ADD_IO, InMemorySandbox(lambda c, s: None))
    assert (check.score, check.failures) == (0.0, ("no ```python code block in the response",))


def test_sandbox_failure_is_reported_not_scored():
    broken = InMemorySandbox(
        lambda code, stdin: SandboxResult(
            status="sandbox_error", exit_code=None, detail="unshare: Operation not permitted"
        )
    )
    check = run_tests("print(5)", ADD_IO, broken)
    assert check.sandbox_error == "unshare: Operation not permitted"


def test_extract_code_takes_the_last_fenced_block():
    text = "```python\nprint(1)\n```\nbetter:\n```py\nprint(2)\n```"
    assert extract_code(text) == "print(2)\n"


def test_tests_must_not_be_empty():
    with pytest.raises(ValueError, match="tests"):
        run_tests("print(1)", CodeTests(), InMemorySandbox(lambda c, s: None))
