"""Reward functions of the user's own (reward.verifiers.function): verl's and TRL's signatures, composed
with the built-in components, every failure a reward of 0 with the reason, mistakes one ConfigError line."""

from __future__ import annotations

import math
import re

import pytest

from reward.scorers import ErrorLog, InProcessScorer, score_input
from reward.verifiers.compose import RewardInput, compute_reward
from reward.verifiers.function import check_functions
from stare.config import ConfigError
from stare.config.reward import RewardConfig
from stare.data.tasks.registry import build_task

VERL = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """GSM8K-style: the text after '####' against the ground truth; extra_info scales a right answer."""
    if data_source == "raises":
        raise ValueError("boom on " + solution_str)
    answer = solution_str.split("####")[-1].strip()
    return float(answer == ground_truth) * extra_info.get("scale", 1.0)


def as_dict(data_source, solution_str, ground_truth, extra_info):
    right = solution_str.strip() == ground_truth
    return {"score": 1.0 if right else -1.0, "acc": right, "pred": solution_str}


def not_a_number(data_source, solution_str, ground_truth, extra_info):
    return float("nan")


def no_score(data_source, solution_str, ground_truth, extra_info):
    return {"acc": True}


def two_args(solution_str, ground_truth):
    return 1.0


def with_kwargs(data_source, solution_str, ground_truth, extra_info, bonus):
    return bonus


def length_reward(prompts, completions, completion_ids, trainer_state, **kwargs):
    """TRL style: 1 - len/10 when the prompt asks for 'short', None (does not apply) otherwise."""
    return [None if "short" not in p else 1.0 - len(ids) / 10 for p, ids in zip(prompts, completion_ids)]


def echo_step(prompts, completions, trainer_state, **kwargs):
    return [float(trainer_state.global_step) + len(completions[0][0]["content"])]


def two_values(prompts, completions, **kwargs):
    return [1.0, 2.0]


def no_kwargs(prompts, completions):
    return [1.0]
'''


@pytest.fixture
def rewards(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(VERL)
    return str(path)


def _config(*components, **rest) -> RewardConfig:
    return RewardConfig.model_validate({"components": list(components), **rest})


def _sample(text: str, answer: str = "72", source: str = "gsm8k", **kw) -> RewardInput:
    return RewardInput(response=text, answer=answer, data_source=source, response_tokens=len(text), **kw)


def test_a_verl_function_scores_with_its_four_arguments(rewards):
    config = _config({"kind": "function", "path": rewards})
    right = compute_reward(_sample("so #### 72", extra_info={"scale": 0.5}), config)
    wrong = compute_reward(_sample("so #### 71"), config)
    assert (right.reward, right.components, right.error) == (0.5, {"compute_score": 0.5}, None)
    assert (wrong.reward, wrong.correct) == (0.0, False)
    assert right.correct is False  # 0.5 < 1: without an "acc", correct means a score of at least 1


def test_a_verl_dict_result_gives_the_score_and_its_acc_is_the_verdict(rewards):
    config = _config({"kind": "function", "path": rewards, "function": "as_dict"})
    right, wrong = compute_reward(_sample("72"), config), compute_reward(_sample("7"), config)
    assert (right.reward, right.correct) == (1.0, True)
    assert (wrong.reward, wrong.correct) == (-1.0, False)  # DAPO's -1 for a wrong answer, verdict from acc


def test_a_function_composes_with_built_in_components_and_weights(rewards):
    config = _config(
        {"kind": "function", "path": rewards, "weight": 2.0},
        {"kind": "format", "weight": 0.1, "config": {"required_tags": ["answer"]}},
    )
    both = compute_reward(_sample("<answer>x</answer> #### 72"), config)
    no_tags = compute_reward(_sample("#### 72"), config)
    assert both.components == {"compute_score": 1.0, "format": 1.0}
    assert both.reward == pytest.approx(2.0 * 1.0 + 0.1 * 1.0, abs=1e-12) and both.correct is True
    assert no_tags.reward == pytest.approx(2.0 * 1.0 + 0.1 * 0.0, abs=1e-12)


def test_the_task_component_is_the_tasks_own_verifier():
    task = build_task("arithmetic")
    problem = task.problems("test", 1, 0)[0]
    config = _config({"kind": "task"}, {"kind": "overlong", "config": {"max_length": 8, "cache_length": 4}})
    x = RewardInput(response=f"#{problem.answer}", answer=problem.answer, response_tokens=6)
    result = compute_reward(x, config, task=task)
    assert result.components == {"task": 1.0, "overlong": -0.5}  # 6 tokens: 2 into the 4-token ramp
    assert (result.reward, result.correct) == (0.5, True)  # right answer, penalised length: still correct


def test_a_trl_function_gets_lists_of_one_and_none_means_it_does_not_apply(rewards):
    config = _config({"kind": "function", "path": rewards, "function": "length_reward", "signature": "trl",
                      "weight": 0.5})  # fmt: skip
    short = compute_reward(_sample("ab", prompt="keep it short", response_token_ids=(4, 5)), config)
    other = compute_reward(_sample("ab", prompt="anything", response_token_ids=(4, 5)), config)
    assert short.reward == pytest.approx(0.5 * (1.0 - 2 / 10), abs=1e-12) and short.error is None
    assert (other.reward, other.error) == (0.0, None)


def test_a_trl_function_can_take_chat_completions_and_the_weight_version(rewards):
    config = _config(
        {"kind": "function", "path": rewards, "function": "echo_step", "signature": "trl", "completions": "messages"}
    )
    assert compute_reward(_sample("abc", step=7), config).reward == 7.0 + 3.0


@pytest.mark.parametrize(
    "function, source, match",
    [
        ("compute_score", "raises", r"compute_score: ValueError: boom on x"),
        ("not_a_number", "gsm8k", r"not_a_number: RewardFunctionError: returned nan, not a finite number"),
        ("no_score", "gsm8k", r"no_score: RewardFunctionError: returned a dict without 'score'"),
    ],
)
def test_a_verl_function_that_fails_scores_zero_with_the_reason(rewards, function, source, match):
    config = _config({"kind": "function", "path": rewards, "function": function}, {"kind": "format", "weight": 1.0})
    result = compute_reward(_sample("x", source=source), config)
    assert result.reward == 0.0 and result.correct is None
    assert result.error is not None and re.match(match, result.error), result.error


def test_a_trl_function_returning_the_wrong_length_scores_zero(rewards):
    config = _config({"kind": "function", "path": rewards, "function": "two_values", "signature": "trl"})
    result = compute_reward(_sample("x"), config)
    assert result.reward == 0.0 and "list of length 2" in result.error


def test_the_components_kwargs_reach_every_call(rewards):
    config = _config({"kind": "function", "path": rewards, "function": "with_kwargs", "kwargs": {"bonus": 0.25}})
    assert compute_reward(_sample("x"), config).reward == 0.25


@pytest.mark.parametrize(
    "component, match",
    [
        ({"path": "nowhere/reward.py"}, r"no such file nowhere/reward\.py"),
        ({"function": "missing"}, r"has no 'missing' \(its functions: \["),
        ({"function": "two_args"}, r"cannot be called as a verl reward function"),
        ({"function": "no_kwargs", "signature": "trl"}, r"a trl reward function takes \*\*kwargs"),
        ({"function": "with_kwargs"}, r"cannot be called as a verl reward function"),  # needs its bonus kwarg
        ({"path": "no_such_module_here"}, r"importing module 'no_such_module_here' raised ModuleNotFoundError"),
    ],
)
def test_a_function_that_cannot_load_is_one_config_error_naming_the_component(rewards, component, match):
    config = _config({"kind": "function", "path": rewards, **component})
    with pytest.raises(ConfigError, match=r"reward\.components\[.*" + match):
        check_functions(config)


def test_a_module_that_raises_on_import_is_a_config_error(tmp_path):
    (tmp_path / "broken.py").write_text("raise RuntimeError('no GPU here')\n")
    with pytest.raises(ConfigError, match=r"importing .*broken\.py raised RuntimeError: no GPU here"):
        check_functions(_config({"kind": "function", "path": str(tmp_path / "broken.py")}))


def test_a_module_name_works_as_the_path(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_pkg").mkdir()
    (tmp_path / "my_rewards_pkg" / "__init__.py").write_text(
        "def score(prompts, completions, **kw):\n    return [0.75]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = _config({"kind": "function", "path": "my_rewards_pkg", "function": "score", "signature": "trl"})
    check_functions(config)
    assert compute_reward(_sample("x"), config).components == {"score": 0.75}


def test_without_a_reward_section_a_raising_task_verifier_scores_zero():
    class Raising:
        name = "raising"

        def reward(self, problem, completion):
            raise KeyError("no answer")

    result = score_input(Raising(), None, _sample("x"))
    assert (result.reward, result.error) == (0.0, "KeyError: 'no answer'")


def test_failures_are_logged_with_their_sample_first_few_then_every_hundredth(rewards):
    lines: list[str] = []
    scorer = InProcessScorer(build_task("arithmetic"), _config({"kind": "function", "path": rewards}))
    scorer.errors = ErrorLog(lines.append, first=5, every=100)
    results = scorer.score([_sample(f"answer {i}", source="raises") for i in range(250)])
    for i, (result, x) in enumerate(zip(results, [_sample(f"answer {i}", source="raises") for i in range(250)])):
        scorer.errors(result, x, f"t{i}")
    assert scorer.errors.total == 250
    assert len(lines) == 5 + 2  # the first 5, then the 100th and the 200th
    assert "compute_score: ValueError: boom on answer 0" in lines[0] and "response='answer 0'" in lines[0]
    assert "data_source=raises" in lines[0] and "(200 so far" in lines[-1]


def test_a_non_finite_reward_never_reaches_a_trajectory(rewards):
    config = _config({"kind": "function", "path": rewards, "function": "not_a_number"})
    assert math.isfinite(compute_reward(_sample("x"), config).reward)
