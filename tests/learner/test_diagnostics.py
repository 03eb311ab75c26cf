import pytest
import torch

from learner.algorithm.quadrants import predicted_entropy_change, quadrant_metrics, quadrant_sums

D = torch.float64


def _entropy(logits):
    logp = torch.log_softmax(logits, -1)
    return -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("token, adv", [(0, 1.0), (3, 1.0), (0, -1.0), (3, -1.0), (1, 0.5)])
def test_first_order_entropy_change_matches_a_small_gradient_step(token, adv):
    logits = torch.tensor([2.0, 0.5, 0.1, -1.0, -2.0], dtype=D)
    eta = 1e-3
    z = logits.clone().requires_grad_(True)
    # one policy-gradient step on token a with advantage A: ascend A log pi_a
    (-adv * torch.log_softmax(z, -1)[token]).backward()
    measured = _entropy(logits - eta * z.grad) - _entropy(logits)
    predicted = predicted_entropy_change(
        torch.log_softmax(logits, -1)[None, None], torch.tensor([[token]]), torch.tensor([[adv]], dtype=D), eta=eta
    )[0, 0]
    assert abs(float(predicted - measured)) / abs(float(measured)) < 0.05


def test_positive_advantage_on_low_surprisal_token_lowers_entropy_and_high_raises_it():
    logp = torch.log_softmax(torch.tensor([3.0, 0.0, -1.0], dtype=D), -1)[None, None]
    dh = lambda tok, a: float(predicted_entropy_change(logp, torch.tensor([[tok]]), torch.tensor([[a]], dtype=D)))  # noqa: E731
    assert dh(0, 1.0) < 0 < dh(2, 1.0)  # confident token down, surprising token up
    assert dh(0, -1.0) > 0 > dh(2, -1.0)  # a negative advantage does the opposite


def test_quadrant_statistics_by_hand():
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0]], dtype=D)
    surprisal = torch.tensor([[0.1, 0.9, 0.2], [0.8, 0.05, 3.0]], dtype=D)
    mask = torch.tensor([[True, True, True], [True, True, True]])
    m = quadrant_metrics(quadrant_sums(adv, surprisal, mask, torch.tensor(0.5, dtype=D)))
    # 6 tokens: pos_high {0.9}, pos_low {0.1, 0.2}, neg_high {0.8}, neg_low {0.05}, one zero-advantage token
    assert [float(m[f"quadrant/{q}/fraction"]) for q in ("pos_high", "pos_low", "neg_high", "neg_low")] == [
        pytest.approx(1 / 6),
        pytest.approx(2 / 6),
        pytest.approx(1 / 6),
        pytest.approx(1 / 6),
    ]
    assert float(m["quadrant/pos_low/mean_surprisal"]) == pytest.approx(0.15)
    assert float(m["quadrant/neg_high/mean_advantage"]) == pytest.approx(-2.0)


def test_quadrant_sums_add_over_micro_batches():
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(6, 5, generator=g, dtype=D)
    s = torch.rand(6, 5, generator=g, dtype=D)
    mask = torch.rand(6, 5, generator=g) > 0.3
    h = torch.tensor(0.5, dtype=D)
    whole = quadrant_sums(adv, s, mask, h)
    parts = quadrant_sums(adv[:2], s[:2], mask[:2], h) + quadrant_sums(adv[2:], s[2:], mask[2:], h)
    torch.testing.assert_close(parts, whole, rtol=1e-12, atol=1e-12)
