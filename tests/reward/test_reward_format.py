"""Format reward: required tags, well formed, once, in order."""

import pytest
from pydantic import ValidationError

from reward.verifiers.format import FormatConfig, format_reward

GOOD = "<think>reasoning</think>\n<answer>42</answer>"


def test_well_formed_response_scores_one():
    assert format_reward(GOOD) == 1.0


@pytest.mark.parametrize(
    "response",
    [
        "<think>reasoning</think>",  # answer missing
        "<think>reasoning</think><answer>42",  # answer not closed
        "<answer>42</answer><think>reasoning</think>",  # wrong order
        "<think>a</think><answer>1</answer><answer>2</answer>",  # answer twice
        "<think>a <answer>1</answer></think>",  # overlapping
        "</answer>42<answer><think>a</think>",  # closed before opened
    ],
    ids=["missing", "unclosed", "order", "twice", "overlap", "reversed"],
)
def test_malformed_response_scores_zero(response):
    assert format_reward(response) == 0.0


def test_prefix_supplies_a_tag_the_prompt_opened():
    config = FormatConfig(prefix="<think>")
    assert format_reward("reasoning</think><answer>1</answer>", config) == 1.0


def test_nothing_after_rejects_trailing_text():
    config = FormatConfig(nothing_after=True)
    assert format_reward(GOOD + "\nbye", config) == 0.0


def test_partial_credit_counts_the_checks_passed():
    # checks: think ok, answer missing, order fails -> 1 of 3
    config = FormatConfig(partial_credit=True)
    assert format_reward("<think>x</think>", config) == pytest.approx(1 / 3)


def test_repeated_tags_pass_when_not_exactly_once():
    config = FormatConfig(exactly_once=False)
    assert format_reward("<think>a</think><think>b</think><answer>1</answer>", config) == 1.0


def test_tag_names_must_be_bare():
    with pytest.raises(ValidationError, match="required_tags"):
        FormatConfig(required_tags=("<answer>",))
