"""learner against the reference implementation (hp-luo/STARE, verl/trainer/ppo/core_algos.py:
STAREController, compute_stare_token_weights, compute_policy_loss_stare with verl's agg_loss), on random
single-micro-batch inputs: token weights, loss and gradients, and the controller's gate/W/M sequences.

`_reference_*` below model the reference's arithmetic from its published formulas (written for this
test, not copied): selection inside the micro-batch, k = max(1, int(nP + 0.999999)), omega = W on L+
and M on L- (C2) when the gate is on, the dual-clip surrogate, agg_loss over the micro-batch; the
controller updates gate, W and M from H_k and step k's loss then reads them, skipping a non-finite H.
Inputs have no surprisal ties (the reference's tie order is torch.topk's, unspecified; docs/algorithm.md).
The reference selects by the log-prob being trained; here it is given the old log-prob, which it equals
on the first update of an on-policy batch (the one-micro-batch case of docs/algorithm.md's table).
"""

import math
import random

import pytest
import torch
from algo_helpers import loss_and_grad, random_step

from learner.algorithm.entropy_controller import EntropyController
from stare.config.algo import ControllerConfig, StareLossConfig

D = torch.float64
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def _reference_weights(select_logp, adv, mask, *, top, variant, gate, w, m):  # [B, L]
    weights = torch.ones_like(adv)
    surprisal = -select_logp.detach()

    def top_mask(candidates):
        n = int(candidates.sum())
        chosen = torch.zeros_like(candidates)
        if n == 0 or top <= 0.0:
            return chosen
        k = min(max(1, int(n * top + 0.999999)), n)
        idx = candidates.reshape(-1).nonzero().squeeze(-1)[torch.topk(surprisal[candidates], k).indices]
        chosen.reshape(-1)[idx] = True
        return chosen

    l_plus = top_mask(mask & (adv > 0))
    l_minus = top_mask(mask & (adv < 0)) if variant == "C2" else torch.zeros_like(mask)
    if gate:
        weights = torch.where(l_plus, torch.full_like(weights, w), weights)
        if variant == "C2":
            weights = torch.where(l_minus, torch.full_like(weights, m), weights)
    return weights


def _reference_loss(logp, old, adv, mask, weights, *, eps_low, eps_high, c, mode):  # []
    ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    clipped = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high))
    pg = torch.where(adv < 0, torch.minimum(-adv * c, clipped), clipped) * weights
    fm = mask.to(pg.dtype)
    if mode == "token-mean":
        return (pg * fm).sum() / fm.sum()
    if mode == "seq-mean-token-sum":
        seq, has = (pg * fm).sum(-1), (fm.sum(-1) > 0).to(pg.dtype)
        return (seq * has).sum() / has.sum()
    if mode == "seq-mean-token-mean":
        count = fm.sum(-1)
        seq, has = (pg * fm).sum(-1) / (count + 1e-8), (count > 0).to(pg.dtype)
        return (seq * has).sum() / has.sum()
    return (pg * fm).sum() / mask.shape[-1]  # seq-mean-token-sum-norm, loss_scale_factor = padded length


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("variant", ["O1", "C2"])
@pytest.mark.parametrize("gate", [True, False])
def test_weights_loss_and_gradients_equal_the_reference_on_random_micro_batches(mode, variant, gate):
    for seed in range(16):
        s = random_step(seed, rows=8, length=12, tie_decimals=None)
        top = (0.05, 0.1, 0.25, 0.5)[seed % 4]
        w, m = 1.0 + 0.1 * (seed % 7), 1.0 - 0.1 * (seed % 5)
        cfg = StareLossConfig(
            top_fraction=top,
            variant=variant,
            agg_mode=mode,
            dual_clip_c=3.0,
            norm_length=12 if mode == "seq-mean-token-sum-norm" else None,
        )
        loss, grad, _ = loss_and_grad(s, cfg, gate=float(gate), w=w, m=m)
        weights = _reference_weights(s["old"], s["adv"], s["mask"], top=top, variant=variant, gate=gate, w=w, m=m)
        logp = s["logp"].clone().requires_grad_(True)
        ref = _reference_loss(
            logp, s["old"], s["adv"], s["mask"], weights, eps_low=cfg.eps_low, eps_high=cfg.eps_high, c=3.0, mode=mode
        )
        if mode == "seq-mean-token-sum-norm":  # the reference: sum / L; here sum / (sequences x L) (documented)
            ref = ref / int(s["mask"].any(-1).sum())
        ref.backward()
        # seq-mean-token-mean: the reference divides by (count + 1e-8), here by count: ~1e-9 relative
        rel = 1e-8 if mode == "seq-mean-token-mean" else 1e-12
        assert float(loss) == pytest.approx(float(ref.detach()), rel=rel, abs=1e-14), seed
        torch.testing.assert_close(grad, logp.grad, rtol=rel, atol=1e-14)


class _ReferenceController:
    """The reference's controller: update(H) sets gate and (sign schedule) W, M; non-finite H: no change."""

    def __init__(self, target, w, m, adaptive, alpha, w_max, m_min):
        self.target, self.w, self.m = target, w, m
        self.adaptive, self.alpha, self.w_max, self.m_min = adaptive, alpha, w_max, m_min
        self.gate = True

    def update(self, h):
        if not math.isfinite(h):
            return
        self.gate = h < self.target
        if not self.adaptive or self.alpha == 0.0:
            return
        sign = 0.0 if h == self.target else math.copysign(1.0, self.target - h)
        self.w = min(max(self.w + self.alpha * sign, 1.0), self.w_max)
        self.m = min(max(self.m - self.alpha * sign, self.m_min), 1.0)


@pytest.mark.parametrize("seed", range(8))
def test_controller_sequences_equal_the_reference_in_its_order(seed):
    rng = random.Random(seed)
    target = rng.choice([0.2, 0.3, 0.45])
    adaptive = seed % 4 != 3
    alpha = rng.choice([0.0, 0.01, 0.05, 0.1])
    args = dict(target=target, w=1.1, m=0.9, adaptive=adaptive, alpha=alpha, w_max=1.5, m_min=0.5)
    ref = _ReferenceController(**args)
    ours = EntropyController(ControllerConfig(**args))  # defaults: order reference, sign, no band, no EMA
    first = rng.uniform(0.0, 0.6)  # a finite first entropy: before it the two start gates differ (documented)
    entropies = [first] + [
        rng.choice([rng.uniform(0.0, 0.6), target, float("nan"), float("inf")])
        if rng.random() < 0.15
        else rng.uniform(0.0, 0.6)
        for _ in range(200)
    ]
    for k, h in enumerate(entropies):
        ref.update(h)
        gate = ours.begin_step(h, h)
        assert (gate, ours.w, ours.m) == (ref.gate, ref.w, ref.m), (k, h)  # what step k's loss reads
        ours.end_step(h)
        assert ours.skipped == (not math.isfinite(h))


def test_before_any_finite_entropy_the_reference_gate_is_on_and_ours_off():
    ref = _ReferenceController(0.3, 1.1, 0.9, True, 0.1, 1.5, 0.5)
    ours = EntropyController(ControllerConfig(target=0.3, w=1.1, m=0.9, adaptive=True, alpha=0.1))
    ref.update(float("nan"))
    assert ref.gate is True and ours.begin_step(float("nan"), float("nan")) is False
