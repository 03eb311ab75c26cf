"""One scoring function: the task's verifier by default, the `reward:` composition when configured,
and the same reward and reward_info whether a trajectory is scored in process (`stare train`) or in
the `stare reward` role's process pool."""

from __future__ import annotations

import numpy as np
import pytest

from reward.scorers import PoolScorer
from reward.worker import score_trajectory
from stare.config import build_config
from stare.data.tasks.registry import build_task
from stare.transport.records import Trajectory

REWARD = {
    "components": [
        {"kind": "math", "weight": 1.0},
        # DAPO overlong shaping: no penalty up to 8 - 4 = 4 tokens, then a ramp to -0.5 at 8 tokens
        {"kind": "overlong", "weight": 1.0, "config": {"max_length": 8, "cache_length": 4, "penalty_factor": 0.5}},
    ]
}


def _trajectory(text: str, answer: str, n_tokens: int, i: int = 0) -> Trajectory:
    return Trajectory(
        run_id="r",
        trajectory_id=f"g{i}:0",
        group_id=f"g{i}",
        group_size=2,
        weight_version=0,
        prompt_token_ids=np.asarray([1, 2], dtype=np.int32),
        response_token_ids=np.arange(3, 3 + n_tokens, dtype=np.int32),
        response_logprobs=np.full(n_tokens, -0.5, dtype=np.float32),
        loss_mask=np.ones(n_tokens, dtype=np.uint8),
        finish_reason="stop",
        answer=answer,
        problem_id=f"p{i}",
        data_source="test",
        response_text=text,
        level=1,
    )


CASES = [  # (response, answer, tokens, expected reward by hand)
    (r"so \boxed{12}", "12", 3, 1.0),  # right, short: 1 + 0
    (r"so \boxed{12}", "12", 6, 1.0 - 0.25),  # right, 2 tokens into the 4-token ramp: 1 - 0.5 * 2/4
    (r"so \boxed{13}", "12", 9, 0.0 - 0.5),  # wrong and past max_length: 0 - 0.5
]


def test_without_a_reward_section_the_task_verifier_scores():
    task = build_task("arithmetic")
    problem = task.problems("test", 1, 0)[0]
    right = score_trajectory(task, _trajectory(f"#{problem.answer}", problem.answer, 3))  # the task's answer format
    wrong = score_trajectory(task, _trajectory(f"#{problem.answer}9", problem.answer, 3))
    assert (right.reward, wrong.reward) == (1.0, 0.0)
    assert right.reward_info == {"correct": True, "finish_reason": "stop"}


@pytest.mark.parametrize("text, answer, tokens, expected", CASES)
def test_a_reward_section_composes_its_verifiers(text, answer, tokens, expected):
    config = build_config({"reward": REWARD}).reward
    t = score_trajectory(build_task("arithmetic"), _trajectory(text, answer, tokens), config)
    assert t.reward == pytest.approx(expected, abs=1e-12)
    assert set(t.reward_info["components"]) == {"math", "overlong"} and "error" not in t.reward_info
    assert t.reward_info["correct"] == (text.endswith("{12}"))  # the answer's verdict, penalty or not


def test_the_process_pool_scores_exactly_as_the_in_process_worker():
    config = build_config({"reward": REWARD}).reward
    in_process = [
        score_trajectory(build_task("arithmetic"), _trajectory(*c[:3], i=i), config) for i, c in enumerate(CASES)
    ]
    pooled = [_trajectory(*c[:3], i=i) for i, c in enumerate(CASES)]
    scorer = PoolScorer("arithmetic", {}, workers=1, timeout_s=60.0, reward_config=config)
    try:
        scorer(pooled)
    finally:
        scorer.close()
    assert [t.reward for t in pooled] == [t.reward for t in in_process]
    assert [t.reward_info for t in pooled] == [t.reward_info for t in in_process]


def test_a_reward_section_with_an_unknown_component_names_the_field():
    from stare.config import ConfigError

    with pytest.raises(ConfigError, match="reward.components"):
        build_config({"reward": {"components": [{"kind": "bleu"}]}})


def test_a_code_component_is_refused_until_trajectories_carry_tests():
    from stare.config import ConfigError

    with pytest.raises(ConfigError, match="kind code"):
        build_config({"reward": {"components": [{"kind": "code"}]}})


def test_an_overlong_penalty_the_responses_can_never_reach_is_refused():
    from stare.config import ConfigError

    never = {
        "components": [{"kind": "math"}, {"kind": "overlong", "config": {"max_length": 4096, "cache_length": 512}}]
    }
    with pytest.raises(ConfigError, match="rollout.max_new_tokens"):
        build_config({"reward": never, "rollout": {"max_new_tokens": 1024}})
