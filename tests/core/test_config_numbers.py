"""Numbers in a config: every float field of the whole config refuses infinity and NaN with its field
named (found by walking configs with every optional section filled, every loss and engine), the
learning rate is bounded where a finite value still destroys the weights, YAML 1.2 exponent floats
(`2e-1`) are numbers in files and in --set, and a bad value names the file or the --set it came from."""

from __future__ import annotations

import copy
import math

import pytest

from stare.config import ConfigError, build_config, load_config, parse_override
from stare.config.algo import LOSS_CONFIGS


def _rich_configs() -> list[dict]:
    """Raw configs with every optional section present, one per loss and per rollout engine."""
    out = []
    for loss in LOSS_CONFIGS:
        for engine in ("hf", "vllm"):
            raw = build_config(
                {
                    "model": {"lora": {"r": 8}},
                    "task": {"eval_sources": {"aime": {"n": 4}}},
                    "rollout": {"engine": {"name": engine}, "max_new_tokens": 64},
                    "loss": {
                        "name": loss,
                        "rollout_correction": {"is_level": "token", "mask_level": "token", "mask_low": 0.5},
                    },
                    "controller": {"band": [0.2, 0.4]},
                    "reward": {
                        "components": [
                            {"kind": "math"},
                            {"kind": "format"},
                            {"kind": "overlong", "config": {"max_length": 64, "cache_length": 16}},
                        ]
                    },
                    "logging": {"wandb": {"project": "p"}},
                }
            ).model_dump(mode="json")
            out.append(raw)
    return out


def _float_paths(node, path=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _float_paths(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _float_paths(value, (*path, i))
    elif isinstance(node, float):
        yield path


def _with(raw: dict, path: tuple, value) -> dict:
    raw = copy.deepcopy(raw)
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return raw


def test_every_float_field_refuses_infinity_and_nan_naming_the_field():
    checked = set()
    for raw in _rich_configs():
        for path in _float_paths(raw):
            for bad in (math.inf, -math.inf, math.nan):
                with pytest.raises(ConfigError) as caught:
                    build_config(_with(raw, path, bad))
                field = str(path[-1]) if not isinstance(path[-1], int) else str(path[-2])
                assert field in str(caught.value), (path, str(caught.value))
            checked.add(".".join(str(p) for p in path if not isinstance(p, int)))
    # the walk reaches every section with floats (a smoke check that it walked the whole config)
    for expected in (
        "optim.lr",
        "optim.grad_clip",
        "optim.betas",
        "controller.target",
        "controller.band",
        "loss.eps_high",
        "loss.rollout_correction.is_cap",
        "loss.kl_coef",
        "loss.cov_ub",
        "rollout.temperature",
        "task.eval_sources.aime.top_p",
        "model.lora.alpha",
        "rollout.engine.gpu_memory_utilization",
        "rollout.tool_use.sandbox.wall_s",
        "reward.timeout_s",
        "reward.components.weight",
        "system.heartbeat_s",
        "control_plane.body_timeout_s",
        "data.oversample",
    ):
        assert expected in checked, sorted(checked)


@pytest.mark.parametrize("value", ["inf", "1e308", "2.0", ".nan"])
def test_a_learning_rate_that_would_destroy_the_weights_is_refused(value):
    with pytest.raises(ConfigError, match=r"optim\.lr: Input should be (a finite number|less than or equal to 1)"):
        build_config({}, overrides=[f"optim.lr={value}"])


def test_exponent_floats_without_a_dot_are_numbers_in_set_and_in_files(tmp_path):
    assert parse_override("controller.target=2e-1") == ("controller.target", 0.2)
    assert parse_override("optim.lr=1E-5") == ("optim.lr", 1e-5)
    assert parse_override("run.name='1e5'") == ("run.name", "1e5")  # quoted: a string
    assert build_config({}, overrides=["controller.target=2e-1"]).controller.target == 0.2
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 3e-4\ncontroller:\n  target: 25e-2\n")
    cfg = load_config(path)
    assert (cfg.optim.lr, cfg.controller.target) == (3e-4, 0.25)


def test_a_bad_value_names_the_file_it_came_from(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lrr: 1\nrun:\n  steps: many\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert f"optim.lrr: Extra inputs are not permitted (got 1, in {path})" in message
    assert (
        f"run.steps: Input should be a valid integer, unable to parse string as an integer (got 'many', in {path})"
        in message
    )
    assert message.endswith(f"fix the value in {path} or with --set FIELD=VALUE")


def test_a_bad_value_from_set_names_the_set(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("run:\n  steps: 10\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, overrides=["run.steps=0"])
    assert str(caught.value) == (
        "invalid config: run.steps: Input should be greater than or equal to 1 (got 0, from --set run.steps=0); "
        "fix the --set value"
    )
