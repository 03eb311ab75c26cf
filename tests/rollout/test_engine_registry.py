"""One engine registry: every engine a run config can name has a builder, and no other name does; an
engine's config is its run-config section plus the model."""

import pytest

from rollout.engines.registry import ENGINES, build_engine
from stare.config import ENGINE_SECTIONS


def test_the_config_and_the_rollout_name_the_same_engines():
    assert set(ENGINES) == set(ENGINE_SECTIONS)


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_an_engines_config_extends_its_run_config_section(name):
    assert issubclass(ENGINES[name].config, ENGINE_SECTIONS[name])
    assert ENGINES[name].config.model_fields["name"].default == name


def test_an_unknown_engine_is_refused_with_the_valid_names():
    with pytest.raises(ValueError, match=r"valid names: \['hf', 'vllm'\]"):
        build_engine({"name": "sglang", "model_path": "x"})
