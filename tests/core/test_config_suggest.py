"""Config errors a reader can act on: an unknown key answers with the closest known one (difflib), a
verl key with its stare field, and no error line prints a whole section or the whole config."""

from __future__ import annotations

import pytest

from stare.config import ConfigError, build_config


def _error(raw: dict | None = None, overrides: list[str] = (), algo: str | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        build_config(raw or {}, overrides=list(overrides), algo=algo)
    return str(info.value)


@pytest.mark.parametrize(
    "override, answer",
    [
        ("optim.mini_batch_size=2", "did you mean optim.mini_batches?"),  # a sibling, by spelling
        ("loss.eps_hgih=0.3", "did you mean loss.eps_high?"),  # inside the loss union (its tag is not a key)
        ("controller.targt=0.2", "did you mean controller.target?"),
        ("run.lr=1e-5", "did you mean optim.lr?"),  # the right name in the wrong section
        ("rollout.engine.gpu_mem=0.5", "did you mean rollout.engine.gpu_memory_utilization?"),  # an abbreviation
    ],
)
def test_an_unknown_key_answers_with_the_closest_known_one(override, answer):
    assert answer in _error(overrides=[override])


def test_a_verl_key_answers_with_its_stare_field():
    text = _error(overrides=["data.train_batch_size=64"])
    assert "data.train_batch_size is a verl setting (stare's rollout.prompts_per_step)" in text
    text = _error(overrides=["actor_rollout_ref.actor.ppo_mini_batch_size=32"])
    assert "stare's optim.mini_batches is a COUNT" in text and "stare convert-verl" in text


def test_a_key_like_nothing_gets_no_guess():
    assert _error(overrides=["zzzz=1"]) == (
        "invalid config: zzzz: Extra inputs are not permitted (got 1, from --set zzzz=1); fix the --set value"
    )


def test_an_unknown_preset_answers_with_the_closest_one():
    assert "did you mean grpo?" in _error(algo="grop")


def test_no_error_line_prints_a_whole_section_or_the_whole_config():
    # validators' errors: their input is a whole section (task) or the whole config (the overlong check)
    text = _error({"task": {"eval_problems": 8, "path": "secret/path.parquet"}})
    assert "task.path is required" in text and "secret" not in text and "{" not in text
    never = {"components": [{"kind": "overlong", "config": {"max_length": 9000, "cache_length": 10}}]}
    text = _error({"reward": never, "run": {"name": "secret-name"}}, ["rollout.max_new_tokens=1024"])
    assert "never reaches" in text and "secret" not in text and "{" not in text
    # a section where a number goes: its size, not its keys (the line echoes the user's own --set only)
    text = _error(overrides=["optim.lr={a: 1, b: 2}"])
    assert "optim.lr:" in text and "(got a section of 2 keys, from --set optim.lr={a: 1, b: 2})" in text
    assert "'a'" not in text


def test_a_long_value_is_cut():
    text = _error(overrides=[f"run.name={'x' * 500}!"])  # the pattern refuses the '!'
    assert "..." in text and len(max(text.splitlines(), key=len)) < 300
