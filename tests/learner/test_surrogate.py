import math

import pytest
import torch

from learner.algorithm.surrogate import Normalizer, aggregate, clipped_surrogate, local_counts

D = torch.float64


def _surrogate(ratio: float, adv: float, dual_clip_c=10.0):
    logp = torch.tensor([[math.log(ratio)]], dtype=D, requires_grad=True)
    loss, clipped = clipped_surrogate(
        logp,
        torch.zeros(1, 1, dtype=D),
        torch.tensor([[adv]], dtype=D),
        eps_low=0.2,
        eps_high=0.28,
        dual_clip_c=dual_clip_c,
    )
    loss.sum().backward()
    return float(loss), float(logp.grad), bool(clipped)


def test_positive_advantage_inside_clip_range_is_minus_a_r_with_gradient():
    loss, grad, clipped = _surrogate(1.1, 2.0)
    assert loss == pytest.approx(-2.2, abs=1e-12)  # -A r
    assert grad == pytest.approx(-2.2, abs=1e-12)  # d(-A e^{logp})/dlogp = -A r
    assert not clipped


def test_positive_advantage_above_one_plus_eps_high_is_clipped_without_gradient():
    loss, grad, clipped = _surrogate(1.5, 1.0)
    assert loss == pytest.approx(-1.28, abs=1e-12)  # max(-1.5, -1.28)
    assert grad == 0.0 and clipped


def test_negative_advantage_below_one_minus_eps_low_is_clipped():
    loss, grad, clipped = _surrogate(0.5, -1.0)
    assert loss == pytest.approx(0.8, abs=1e-12)  # max(0.5, 0.8)
    assert grad == 0.0 and clipped


def test_dual_clip_bounds_negative_advantage_at_c():
    loss, grad, clipped = _surrogate(20.0, -1.0)
    assert loss == pytest.approx(10.0, abs=1e-12)  # min(max(20, 1.28), 10)
    assert grad == 0.0 and clipped


def test_without_dual_clip_large_ratio_is_unbounded():
    loss, grad, _ = _surrogate(20.0, -1.0, dual_clip_c=None)
    assert loss == pytest.approx(20.0, abs=1e-9)
    assert grad == pytest.approx(20.0, abs=1e-9)


def test_positive_advantage_below_one_minus_eps_low_keeps_gradient():
    loss, grad, clipped = _surrogate(0.5, 1.0)
    assert loss == pytest.approx(-0.5, abs=1e-12)  # max(-0.5, -0.8)
    assert grad == pytest.approx(-0.5, abs=1e-12) and not clipped


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0], [7.0, 7.0, 7.0]], dtype=D)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]], dtype=torch.bool)  # last row fully masked


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 15 / 5),
        ("seq-mean-token-sum", (6 + 9) / 2),
        ("seq-mean-token-mean", (2 + 4.5) / 2),
        ("seq-mean-token-sum-norm", (6 + 9) / (2 * 4)),
    ],
)
def test_aggregation_modes_by_hand(mode, expected):
    tokens, seqs = local_counts(MASK)
    assert (float(tokens), float(seqs)) == (5.0, 2.0)  # the fully masked row is not a sequence
    out = aggregate(LOSS, MASK, mode, Normalizer(tokens, seqs, norm_length=4.0))
    assert float(out) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_aggregation_shares_of_row_splits_add_up_to_the_whole(mode):
    tokens, seqs = local_counts(MASK)
    norm = Normalizer(tokens, seqs, 4.0)
    whole = aggregate(LOSS, MASK, mode, norm)
    parts = sum(aggregate(LOSS[i : i + 1], MASK[i : i + 1], mode, norm) for i in range(3))
    assert float(parts) == pytest.approx(float(whole), abs=1e-12)
