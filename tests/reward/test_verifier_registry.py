"""One verifier registry: every component kind the config accepts has a scoring function, and no other."""

import typing

import pytest

from reward.verifiers import VERIFIERS, register_verifier
from stare.config.reward import RewardComponent


def _config_kinds() -> set[str]:
    union = typing.get_args(RewardComponent)[0]  # Annotated[Union[...], Field(discriminator="kind")]
    return {cls.model_fields["kind"].default for cls in typing.get_args(union)}


def test_the_config_and_the_reward_role_name_the_same_kinds():
    assert set(VERIFIERS) == _config_kinds() == {"math", "code", "format", "overlong", "task", "function"}


def test_a_kind_cannot_be_registered_twice():
    with pytest.raises(ValueError, match="registered twice"):
        register_verifier("math")(lambda c, x, context: 0.0)
