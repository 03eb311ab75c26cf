"""One loss registry: every loss the config accepts has a learner entry (its function and step-global
selection), and no other name does; every preset trains a registered loss."""

from learner.algorithm.losses import LOSSES, register_loss
from stare.config import ALGO_PRESETS, build_config
from stare.config.algo import LOSS_CONFIGS


def test_the_config_and_the_learner_name_the_same_losses():
    assert set(LOSS_CONFIGS) == set(LOSSES)


def test_each_registered_loss_config_names_itself_and_builds_from_its_name():
    for name, cls in LOSS_CONFIGS.items():
        assert cls().name == name
        assert type(build_config({"loss": {"name": name}}).loss) is cls


def test_every_algorithm_preset_trains_a_registered_loss():
    for algo in ALGO_PRESETS:
        assert build_config({}, algo=algo).loss.name in LOSS_CONFIGS


def test_a_loss_cannot_be_registered_twice():
    import pytest

    with pytest.raises(ValueError, match="registered twice"):
        register_loss("grpo")(lambda x, ctx, cfg: None)
