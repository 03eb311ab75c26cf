"""docs/examples/gsm8k_reward.py, the example docs/reward.md shows, scored as the reward workers score it:
in the scoring processes, composed with a format component."""

from pathlib import Path

import pytest

from reward.scorers import PoolScorer
from reward.verifiers.compose import RewardInput
from stare.config.reward import RewardConfig

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "gsm8k_reward.py"


@pytest.mark.slow
def test_the_documented_example_scores_gsm8k_answers():
    config = RewardConfig.model_validate(
        {
            "components": [
                {"kind": "function", "path": str(EXAMPLE)},
                {"kind": "format", "weight": 0.5, "config": {"required_tags": ["answer"]}},
            ]
        }  # fmt: skip
    )
    scorer = PoolScorer("arithmetic", {}, workers=1, reward_config=config)
    try:
        right, wrong, none = scorer.score(
            [
                RewardInput(response="<answer>#### 1,234</answer>", answer="1234", data_source="openai/gsm8k"),
                RewardInput(response="#### 72", answer="71", data_source="openai/gsm8k"),
                RewardInput(response="I think 72", answer="72", data_source="openai/gsm8k"),
            ]
        )
    finally:
        scorer.close()
    assert (right.reward, right.correct) == (1.0 + 0.5 * 1.0, True)  # right number and the tags
    assert (wrong.reward, wrong.correct) == (0.1, False)  # a number, the wrong one, no tags
    assert (none.reward, none.correct, none.error) == (0.0, False, None)


def test_docs_show_the_example_whole():
    assert EXAMPLE.read_text().strip() in (ROOT / "docs" / "reward.md").read_text()
