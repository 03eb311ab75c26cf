import math
from dataclasses import replace

import pytest
import torch
from algo_helpers import context, loss_and_grad, random_step, step_tokens, uids_for

from learner.algorithm.losses import LossInputs, policy_loss
from learner.algorithm.rollout_correction import rollout_correction
from learner.algorithm.step_plan import plan_step
from stare.config.algo import GrpoLossConfig, RefKLConfig, StareLossConfig

D = torch.float64
MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _cfg(name, mode="token-mean", **kw):
    common = dict(agg_mode=mode, norm_length=12 if mode == "seq-mean-token-sum-norm" else None)
    return (StareLossConfig if name == "stare" else GrpoLossConfig)(**common, **kw)


def _hand_step():
    # One sequence with A = +1 (4 tokens), one with A = -1 (4 tokens); on-policy (ratio 1).
    probs = torch.tensor([[0.9, 0.2, 0.6, 0.05], [0.8, 0.1, 0.5, 0.3]], dtype=D)
    old = probs.log()
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4], dtype=D)
    mask = torch.ones(2, 4, dtype=torch.bool)
    s = dict(old=old, logp=old.clone(), adv=adv, mask=mask, entropy=torch.zeros(2, 4, dtype=D), uid=uids_for(2, 4))
    return s


def test_o1_weights_the_top_surprisal_positive_token_by_w():
    s = _hand_step()
    cfg = StareLossConfig(top_fraction=0.25, variant="O1")  # ceil(0.25 * 4) = 1 token per sign
    loss, grad, _ = loss_and_grad(s, cfg, gate=1.0, w=1.5, m=0.5)
    # L+ = token with p = 0.05 (surprisal 3.0); token-mean over 8 tokens, ratio 1:
    # loss = (-(1 + 1 + 1 + 1.5) + (1 + 1 + 1 + 1)) / 8 = -0.5 / 8
    assert float(loss) == pytest.approx(-0.5 / 8, abs=1e-12)
    # d/dlogp of -A omega r / 8 = -A omega / 8 at r = 1
    expected = torch.tensor([[-1, -1, -1, -1.5], [1, 1, 1, 1]], dtype=D) / 8
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)


def test_c2_also_damps_the_top_surprisal_negative_token_by_m():
    s = _hand_step()
    cfg = StareLossConfig(top_fraction=0.25, variant="C2")
    loss, grad, _ = loss_and_grad(s, cfg, gate=1.0, w=1.5, m=0.5)
    # L- = token with p = 0.1: its term 1 becomes 0.5 -> loss = (-4.5 + 3.5) / 8
    assert float(loss) == pytest.approx(-1.0 / 8, abs=1e-12)
    expected = torch.tensor([[-1, -1, -1, -1.5], [1, 0.5, 1, 1]], dtype=D) / 8
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)


def test_gate_off_is_grpo_even_with_w_and_m():
    s = _hand_step()
    loss, grad, _ = loss_and_grad(s, StareLossConfig(top_fraction=0.5, variant="C2"), gate=0.0, w=1.5, m=0.5)
    grpo_loss, grpo_grad, _ = loss_and_grad(s, GrpoLossConfig())
    assert torch.equal(loss, grpo_loss) and torch.equal(grad, grpo_grad)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_omega_one_everywhere_reproduces_grpo_exactly(mode, seed):
    s = random_step(seed)
    stare = loss_and_grad(s, _cfg("stare", mode, variant="C2", top_fraction=0.3), gate=1.0, w=1.0, m=1.0)
    grpo = loss_and_grad(s, _cfg("grpo", mode))
    assert torch.equal(stare[0], grpo[0])
    assert torch.equal(stare[1], grpo[1])


def test_p_zero_selects_nothing_and_is_grpo():
    s = random_step(4)
    stare = loss_and_grad(s, StareLossConfig(top_fraction=0.0, variant="C2"), gate=1.0, w=1.5, m=0.5)
    grpo = loss_and_grad(s, GrpoLossConfig())
    assert torch.equal(stare[1], grpo[1])


def test_p_one_weights_every_signed_token():
    s = random_step(5)
    _, grad, _ = loss_and_grad(s, StareLossConfig(top_fraction=1.0, variant="C2"), gate=1.0, w=1.5, m=0.5)
    _, grpo_grad, _ = loss_and_grad(s, GrpoLossConfig())
    expected = grpo_grad * torch.where(s["adv"] > 0, 1.5, torch.where(s["adv"] < 0, 0.5, 1.0))
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("seed", range(4))
def test_no_token_gradient_changes_sign_under_stare(seed):
    s = random_step(seed, rows=10, length=16)
    _, grad, _ = loss_and_grad(s, StareLossConfig(top_fraction=0.4, variant="C2"), gate=1.0, w=1.5, m=0.5)
    _, grpo_grad, _ = loss_and_grad(s, GrpoLossConfig())
    assert torch.equal(torch.sign(grad), torch.sign(grpo_grad))


def test_fully_masked_row_gets_no_gradient():
    s = random_step(6)
    _, grad, _ = loss_and_grad(s, StareLossConfig(variant="C2"), gate=1.0)
    assert torch.equal(grad[-1], torch.zeros_like(grad[-1]))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("splits", [2, 4])
def test_micro_batch_split_gives_the_same_loss_and_gradient(mode, splits):
    s = random_step(7, rows=8, length=12)
    cfg = _cfg("stare", mode, variant="C2", top_fraction=0.2)
    whole = loss_and_grad(s, cfg, splits=1)
    split = loss_and_grad(s, cfg, splits=splits)
    torch.testing.assert_close(split[0], whole[0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(split[1], whole[1], rtol=1e-12, atol=1e-14)


def test_tis_weight_composes_with_stare_omega():
    s = _hand_step()
    rollout = s["old"] - torch.tensor([[0.0, 0.0, 0.0, math.log(2.0)], [0.0] * 4], dtype=D)  # rollout p halved
    cfg = StareLossConfig(top_fraction=0.25, variant="O1", rollout_correction={"is_level": "token", "is_cap": 1.5})
    corr = rollout_correction(s["old"], rollout, s["mask"], cfg.rollout_correction)
    ctx = plan_step(step_tokens(s), cfg, gate=1.0, w=1.2, m=1.0)
    logp = s["logp"].clone().requires_grad_(True)
    x = LossInputs(logp, s["old"], s["adv"], s["mask"], s["uid"], rollout_logprobs=rollout, is_weight=corr.weight)
    policy_loss(x, ctx, cfg).loss.backward()
    # token (0, 3) is L+ (p = 0.05) and its weight is min(2, 1.5) = 1.5: -A omega w / 8 = -1.2 x 1.5 / 8
    expected = torch.tensor([[-1, -1, -1, -1.8], [1, 1, 1, 1]], dtype=D) / 8
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "cfg",
    [
        StareLossConfig(variant="C2"),
        # the reference KL and the entropy bonus on top (learner/algorithm/losses/regularizers.py)
        StareLossConfig(variant="C2", ref_kl=RefKLConfig(coef=0.1, estimator="k3"), entropy_coef=0.01),
    ],
)
def test_loss_path_has_no_host_sync_on_meta_tensors(cfg):
    # Meta tensors carry no data: any .item(), .tolist(), .cpu() or data-dependent branch raises.
    s = random_step(0)
    ctx = plan_step(step_tokens(s), cfg, gate=1.0, w=1.1, m=0.9)
    to_meta = lambda t: t.to("meta")  # noqa: E731
    meta_ctx = context(
        ctx,
        norm=type(ctx.norm)(to_meta(ctx.norm.num_tokens), to_meta(ctx.norm.num_seqs), ctx.norm.norm_length),
        gate=to_meta(ctx.gate),
        w=to_meta(ctx.w),
        m=to_meta(ctx.m),
        pos_threshold=type(ctx.pos_threshold)(*map(to_meta, ctx.pos_threshold)),
        neg_threshold=type(ctx.neg_threshold)(*map(to_meta, ctx.neg_threshold)),
    )
    logp = s["logp"].to("meta").requires_grad_(True)
    x = LossInputs(logp, *(to_meta(s[k]) for k in ("old", "adv", "mask", "uid")))
    x = replace(x, entropy=to_meta(s["entropy"]), ref_logprobs=to_meta(s["old"]))
    out = policy_loss(x, meta_ctx, cfg)
    out.loss.backward()
    assert out.loss.device.type == "meta" and logp.grad.shape == logp.shape


def test_plan_step_has_no_host_sync_on_meta_tensors():
    s = random_step(1)
    tokens = step_tokens({k: v.to("meta") for k, v in s.items()})
    ctx = plan_step(tokens, StareLossConfig(), gate=1.0, w=1.1, m=0.9)
    assert ctx.pos_threshold.key.device.type == "meta"
