"""DAPO soft overlong punishment, values derived by hand from eq. 13 of the paper."""

import pytest
from pydantic import ValidationError

from reward.verifiers.overlong import OverlongConfig, overlong_penalty

# L_max = 100, L_cache = 20: no penalty up to 80, linear to -1 at 100, -1 beyond.
CONFIG = OverlongConfig(max_length=100, cache_length=20)


@pytest.mark.parametrize(
    "length,expected",
    [
        (0, 0.0),
        (80, 0.0),  # exactly L_max - L_cache
        (81, -0.05),  # (80 - 81) / 20
        (90, -0.5),  # (80 - 90) / 20
        (100, -1.0),  # exactly L_max
        (101, -1.0),  # beyond L_max
    ],
)
def test_penalty_follows_the_dapo_formula(length, expected):
    assert overlong_penalty(length, CONFIG) == pytest.approx(expected, abs=1e-12)


def test_penalty_factor_scales_the_penalty():
    config = OverlongConfig(max_length=100, cache_length=20, penalty_factor=0.5)
    assert overlong_penalty(90, config) == pytest.approx(-0.25)


def test_zero_cache_is_a_hard_cut():
    config = OverlongConfig(max_length=100, cache_length=0)
    assert (overlong_penalty(100, config), overlong_penalty(101, config)) == (0.0, -1.0)


def test_cache_longer_than_max_is_rejected():
    with pytest.raises(ValidationError, match="cache_length"):
        OverlongConfig(max_length=10, cache_length=11)


def test_negative_length_is_rejected():
    with pytest.raises(ValueError, match="length"):
        overlong_penalty(-1, CONFIG)
