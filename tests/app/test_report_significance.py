"""The small-sample statistics of docs/results.md (stare.app.report.stats): Student's t, the exact
sign-flip test, Holm's adjustment and the paired t-test's power, against tabulated values and
values derived by hand in the comments."""

import itertools
import math

import numpy as np
import pytest

from stare.app.report.stats import (
    bootstrap_coverage,
    holm,
    paired_diff,
    paired_t_power,
    seeds_for_power,
    sign_flip_p,
    t_cdf,
    t_interval,
    t_quantile,
    t_test_p,
)


@pytest.mark.parametrize(
    "q, df, tabulated",  # Student's t table (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2), 3 decimals
    [(0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 4, 2.776), (0.975, 9, 2.262), (0.975, 30, 2.042),
     (0.95, 10, 1.812), (0.995, 5, 4.032), (0.9, 100, 1.290)],
)  # fmt: skip
def test_t_quantile_matches_the_table(q, df, tabulated):
    assert t_quantile(q, df) == pytest.approx(tabulated, abs=5e-4)
    assert t_quantile(1 - q, df) == pytest.approx(-t_quantile(q, df), abs=1e-12)


def test_t_cdf_matches_the_closed_forms_of_one_two_and_three_degrees_of_freedom():
    assert t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-15)  # Cauchy: 1/2 + atan(1)/pi
    assert t_cdf(2.0, 2) == pytest.approx(0.5 + 2 / (2 * math.sqrt(6)), abs=1e-15)  # 1/2 + t / (2 sqrt(2 + t^2))
    t = 1.3  # df 3: 1/2 + (1/pi) (t / (sqrt(3) (1 + t^2/3)) + atan(t / sqrt(3)))
    assert t_cdf(t, 3) == pytest.approx(
        0.5 + (t / (math.sqrt(3) * (1 + t * t / 3)) + math.atan(t / math.sqrt(3))) / math.pi
    )
    assert t_cdf(-t, 3) == pytest.approx(1 - t_cdf(t, 3), abs=1e-15)
    assert t_cdf(0.0, 7) == 0.5


def test_t_interval_and_t_test_of_one_to_five_by_hand():
    # mean 3, sd sqrt(2.5), se sqrt(2.5/5) = sqrt(0.5); half width t_{0.975,4} sqrt(0.5)
    mean, low, high = t_interval([1, 2, 3, 4, 5])
    half = 2.7764451051977934 * math.sqrt(0.5)
    assert (mean, low, high) == pytest.approx((3.0, 3 - half, 3 + half), abs=1e-12)
    # t = 3 / sqrt(0.5) = 3 sqrt(2), df 4: tan(theta) = t / 2 = 3 / sqrt(2), sin = 3 / sqrt(11),
    # cos^2 = 2 / 11; P(|T| <= t) = sin (1 + cos^2 / 2) = 36 / (11 sqrt(11))
    assert t_test_p([1, 2, 3, 4, 5]) == pytest.approx(1 - 36 / (11 * math.sqrt(11)), abs=1e-14)
    assert t_interval([0.5]) is None and t_test_p([0.5]) is None  # one seed: no spread to estimate
    assert t_test_p([0.0, 0.0, 0.0]) == 1.0 and t_test_p([0.2, 0.2]) == 0.0  # no spread


@pytest.mark.parametrize(
    "values, p",
    [
        ([0.1, 0.2, 0.05, 0.3, 0.15], 2 / 32),  # all positive: only all-plus and all-minus reach |sum|
        ([1.0, 2.0, 3.0], 2 / 8),  # 3 seeds can never go below 0.25
        ([1.0, 2.0, 3.0, -0.5], 4 / 16),  # |6.5 - 2 F| >= 5.5 for flipped sums F in {0, 0.5, 6, 6.5}
        ([1.0, -2.0], 1.0),  # |+-1 +-2| is 1 or 3, never below the observed 1
        ([1.0, 1.0], 2 / 4),  # ties count: |sum| 2, 0, 0, 2
        ([0.0, 0.0, 0.0], 1.0),
    ],
)
def test_sign_flip_p_enumerates_every_sign_assignment(values, p):
    assert sign_flip_p(values) == p


def test_sign_flip_p_beyond_sixteen_seeds_equals_brute_force():
    x = np.random.default_rng(3).normal(0.3, 1.0, 17)  # [17]: the block path (16 low bits, 1 high)
    sums = np.abs(np.array(list(itertools.product((-1.0, 1.0), repeat=17))) @ x)  # [2^17]
    assert sign_flip_p(list(x)) == np.mean(sums >= abs(x.sum()) - 1e-12 * np.abs(x).sum())
    assert sign_flip_p([0.1] * 17) == 2 / 2**17


def test_holm_steps_down_keeps_order_and_caps_at_one():
    # sorted 0.005, 0.01, 0.03, 0.04 x 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-15)
    assert holm([0.5, 0.6]) == [1.0, 1.0]
    assert holm([0.2]) == [0.2] and holm([]) == []


@pytest.mark.parametrize("effect, seeds", [(0.2, 199), (0.5, 34), (0.8, 15), (1.0, 10)])
def test_seeds_for_80_percent_power_match_the_paired_t_tables(effect, seeds):
    # Cohen (1988) Table 2.4.1 / G*Power "means: difference from constant (one sample case)",
    # two-sided alpha 0.05, power 0.80
    assert seeds_for_power(effect * 0.04, 0.04) == seeds
    assert paired_t_power(effect, seeds) >= 0.8 > paired_t_power(effect, seeds - 1)


def test_power_at_no_effect_is_alpha_and_the_edge_cases():
    assert paired_t_power(0.0, 5) == pytest.approx(0.05, abs=1e-7)  # central t: the test's own level
    assert paired_t_power(0.0, 2, alpha=0.2) == pytest.approx(0.2, abs=1e-7)  # df 1: S's density is finite at 0
    assert seeds_for_power(0.0, 0.1) is None  # nothing to detect
    assert seeds_for_power(0.1, 0.0) == 2  # no spread: the smallest test that has a variance
    assert seeds_for_power(0.001, 0.1) is None  # effect 0.01 needs ~78,000 seeds: above the search


def test_bootstrap_coverage_over_few_seeds_by_hand():
    # n = 3: z sqrt(2/3) = 1.600304, df 2: t / sqrt(2 + t^2) = 1.600304 / 2.135643
    assert bootstrap_coverage(3) == pytest.approx(0.749331, abs=2e-6)
    # n = 5: z sqrt(4/5) = 1.7530447, df 4: tan = 0.8765223, cos^2 = 0.5655176, sin = 0.6591527;
    # sin (1 + cos^2 / 2) = 0.6591527 x 1.2827588 = 0.845534
    assert bootstrap_coverage(5) == pytest.approx(0.845534, abs=2e-6)


def test_paired_diff_gathers_every_statistic_of_one_comparison():
    d = paired_diff([0.1, 0.2, 0.05, 0.3, 0.15])
    assert (d.n, d.mean, d.p_sign) == (5, pytest.approx(0.16), 2 / 32)
    assert d.t_ci == pytest.approx(t_interval([0.1, 0.2, 0.05, 0.3, 0.15])[1:])
    assert d.boot[0] <= d.mean <= d.boot[1] and d.seeds_80 == seeds_for_power(
        0.16, float(np.std([0.1, 0.2, 0.05, 0.3, 0.15], ddof=1))
    )
    one = paired_diff([0.4])
    assert (one.t_ci, one.p_t, one.p_sign, one.seeds_80) == (None, None, 1.0, None)
    assert paired_diff([]) is None
