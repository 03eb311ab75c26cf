"""compute_reward: weighted components, and failures turned into reward 0 with a reason."""

import time

import pytest
from pydantic import ValidationError

import reward.verifiers.compose as compose
from reward.verifiers.code import AssertTest, CodeTests
from reward.verifiers.compose import RewardConfig, RewardInput, compute_reward
from stare.sandbox import InMemorySandbox, SandboxResult

MATH_AND_FORMAT = RewardConfig(
    components=(
        {"kind": "math", "weight": 1.0},
        {"kind": "format", "weight": 0.1},
        {"kind": "overlong", "weight": 1.0, "config": {"max_length": 100, "cache_length": 20}},
    )
)
RIGHT = "<think>half</think><answer>\\frac{1}{2}</answer>"


def test_reward_is_the_weighted_sum_of_component_scores():
    # math 1 * 1.0 + format 0.1 * 1.0 + overlong 1.0 * (80 - 90) / 20 = 1.1 - 0.5
    result = compute_reward(RewardInput(response=RIGHT, answer="0.5", response_tokens=90), MATH_AND_FORMAT)
    assert result.components == {"math": 1.0, "format": 1.0, "overlong": -0.5}
    assert result.reward == pytest.approx(0.6)
    assert result.error is None


def test_wrong_answer_is_a_score_not_an_error():
    result = compute_reward(RewardInput(response=RIGHT, answer="2", response_tokens=10), MATH_AND_FORMAT)
    assert (result.reward, result.error) == (pytest.approx(0.1), None)


def test_missing_reference_gives_zero_and_names_the_field():
    result = compute_reward(RewardInput(response=RIGHT, response_tokens=10), MATH_AND_FORMAT)
    assert result.reward == 0.0
    assert result.error == ("math: ValueError: RewardInput.answer is missing; the math component needs it")


def test_crashing_verifier_gives_zero_with_the_reason(monkeypatch):
    def crash(*_):
        raise ZeroDivisionError("boom")

    monkeypatch.setitem(compose.VERIFIERS, "format", crash)
    result = compute_reward(RewardInput(response=RIGHT, answer="0.5", response_tokens=1), MATH_AND_FORMAT)
    assert (result.reward, result.error) == (0.0, "format: ZeroDivisionError: boom")


def test_hanging_verifier_gives_zero_after_the_timeout(monkeypatch):
    def hang(*_):
        while True:
            pass

    monkeypatch.setitem(compose.VERIFIERS, "math", hang)
    config = MATH_AND_FORMAT.model_copy(update={"timeout_s": 0.2})
    start = time.monotonic()
    result = compute_reward(RewardInput(response=RIGHT, answer="0.5", response_tokens=1), config)
    assert (result.reward, result.error) == (0.0, "math: timed out after 0.2 s")
    assert time.monotonic() - start < 2


def test_sandbox_failure_gives_zero_not_a_wrong_answer():
    broken = InMemorySandbox(
        lambda code, stdin: SandboxResult(status="sandbox_error", exit_code=None, detail="no namespaces")
    )
    config = RewardConfig(components=({"kind": "code"},))
    sample = RewardInput(response="```python\ndef f(): pass\n```", tests=CodeTests(asserts=(AssertTest(code="f()"),)))
    result = compute_reward(sample, config, sandbox=broken)
    assert (result.reward, result.error) == (0.0, "code: RuntimeError: sandbox failed: no namespaces")


def test_unknown_kind_lists_the_valid_ones():
    with pytest.raises(ValidationError, match="'math', 'code', 'format', 'overlong'"):
        RewardConfig(components=({"kind": "maths"},))


def test_two_components_of_one_kind_need_names():
    with pytest.raises(ValidationError, match="give each component"):
        RewardConfig(components=({"kind": "format"}, {"kind": "format", "weight": 0.5}))
