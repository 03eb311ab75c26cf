"""One loss registry: every loss the config accepts has a step plan and a loss function, and no
other name does."""

from stare.config.algo import LOSS_CONFIGS
from stare.config import ALGO_PRESETS, build_config
from stare.learner.policy_loss import POLICY_LOSSES
from stare.learner.step_plan import SELECTIONS


def test_the_config_the_step_plan_and_the_loss_functions_name_the_same_losses():
    assert set(LOSS_CONFIGS) == set(SELECTIONS) == set(POLICY_LOSSES)


def test_each_registered_loss_config_names_itself_and_builds_from_its_name():
    for name, cls in LOSS_CONFIGS.items():
        assert cls().name == name
        assert type(build_config({"loss": {"name": name}}).loss) is cls


def test_every_algorithm_preset_trains_a_registered_loss():
    for algo in ALGO_PRESETS:
        assert build_config({}, algo=algo).loss.name in LOSS_CONFIGS
