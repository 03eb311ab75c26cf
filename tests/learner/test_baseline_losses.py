import pytest
import torch
from algo_helpers import loss_and_grad, random_step, step_tokens

from learner.algorithm.losses import LossInputs, policy_loss
from learner.algorithm.losses.covariance import centered_covariance, clip_cov_candidates
from learner.algorithm.losses.high_entropy import high_entropy_mask
from learner.algorithm.selection import hash_uniform, in_topk
from learner.algorithm.step_plan import plan_step
from stare.config.algo import (
    ClipCovLossConfig,
    EntropyBonusLossConfig,
    GrpoLossConfig,
    HighEntropyLossConfig,
    KLCovLossConfig,
)

D = torch.float64


def _big_step(seed=0, rows=64, length=64):
    s = random_step(seed, rows=rows, length=length, tie_decimals=None)
    # Spread the advantages so plenty of tokens have covariance in (1, 5).
    s["adv"] = s["adv"] * 3
    return s


def _x(s):
    return LossInputs(
        s["logp"], s["old"], s["adv"], s["mask"], s["uid"], entropy=s["entropy"], step_entropy=s["entropy"]
    )


@pytest.mark.parametrize("ratio", [2e-4, 0.01, 0.05])
def test_kl_cov_selects_exactly_floor_ratio_of_tokens_with_the_largest_covariance(ratio):
    s = _big_step()
    cfg = KLCovLossConfig(kl_ratio=ratio)
    ctx = plan_step(step_tokens(s), cfg, gate=0.0, w=1.0, m=1.0)
    n = int(s["mask"].sum())
    selected = in_topk(centered_covariance(_x(s), ctx), s["uid"], s["mask"], ctx.select_threshold)
    assert int(selected.sum()) == max(1, int(ratio * n))
    cov = centered_covariance(_x(s), ctx)
    assert cov[selected].min() >= cov[s["mask"] & ~selected].max()


def test_kl_cov_covariance_is_centred_over_the_step():
    s = _big_step()
    ctx = plan_step(step_tokens(s), KLCovLossConfig(), gate=0.0, w=1.0, m=1.0)
    m = s["mask"]
    expected = (s["adv"] - s["adv"][m].mean()) * (s["old"] - s["old"][m].mean())
    torch.testing.assert_close(centered_covariance(_x(s), ctx)[m], expected[m], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("ratio", [2e-4, 0.01])
def test_clip_cov_detaches_exactly_floor_ratio_of_tokens_among_band_candidates(ratio):
    s = _big_step()
    cfg = ClipCovLossConfig(clip_ratio=ratio)
    ctx = plan_step(step_tokens(s), cfg, gate=0.0, w=1.0, m=1.0, seed=3)
    candidates = clip_cov_candidates(centered_covariance(_x(s), ctx), s["mask"], cfg)
    n = int(s["mask"].sum())
    assert int(candidates.sum()) > max(1, int(ratio * n))  # the cap does not bind here
    picked = in_topk(hash_uniform(s["uid"], 3), s["uid"], candidates, ctx.select_threshold)
    assert int(picked.sum()) == max(1, int(ratio * n))
    assert not (picked & ~candidates).any()


def test_clip_cov_zeroes_the_gradient_of_picked_tokens_only():
    s = _big_step()
    cfg = ClipCovLossConfig(clip_ratio=0.01)
    _, grad, ctx = loss_and_grad(s, cfg, seed=3)
    _, grpo_grad, _ = loss_and_grad(s, GrpoLossConfig())
    candidates = clip_cov_candidates(centered_covariance(_x(s), ctx), s["mask"], cfg)
    picked = in_topk(hash_uniform(s["uid"], 3), s["uid"], candidates, ctx.select_threshold)
    assert torch.equal(grad[picked], torch.zeros_like(grad[picked]))
    assert torch.equal(grad[~picked], grpo_grad[~picked])


def test_clip_cov_caps_at_the_number_of_candidates():
    s = random_step(0)  # small advantages: few or no candidates in (1, 5)
    cfg = ClipCovLossConfig(clip_ratio=1.0, cov_lb=100.0, cov_ub=200.0)
    ctx = plan_step(step_tokens(s), cfg, gate=0.0, w=1.0, m=1.0)
    picked = in_topk(hash_uniform(s["uid"], 0), s["uid"], s["mask"] & False, ctx.select_threshold)
    assert int(picked.sum()) == 0 and torch.isinf(ctx.select_threshold.key)


def test_kl_cov_loss_by_hand_on_selected_token():
    s = _big_step(rows=8, length=8)
    cfg = KLCovLossConfig(kl_ratio=0.05, kl_coef=2.0)
    ctx = plan_step(step_tokens(s), cfg, gate=0.0, w=1.0, m=1.0)
    x = _x(s)
    sel = in_topk(centered_covariance(x, ctx), s["uid"], s["mask"], ctx.select_threshold)
    ratio = torch.exp(s["logp"] - s["old"])
    per_token = -s["adv"] * ratio + 2.0 * sel * (s["logp"] - s["old"]).abs()
    expected = (per_token * s["mask"]).sum() / s["mask"].sum()
    torch.testing.assert_close(policy_loss(x, ctx, cfg).loss, expected, rtol=1e-12, atol=1e-12)


def test_entropy_bonus_subtracts_coef_times_mean_entropy():
    s = random_step(2)
    cfg = EntropyBonusLossConfig(coef=0.01)
    ctx = plan_step(step_tokens(s), cfg, gate=0.0, w=1.0, m=1.0)
    grpo = policy_loss(_x(s), ctx, GrpoLossConfig()).loss
    expected = grpo - 0.01 * s["entropy"][s["mask"]].mean()
    torch.testing.assert_close(policy_loss(_x(s), ctx, cfg).loss, expected, rtol=1e-12, atol=1e-12)


def test_80_20_trains_the_top_fifth_by_entropy_normalised_over_them():
    s = random_step(3, rows=16, length=20, tie_decimals=None)
    cfg = HighEntropyLossConfig(top_fraction=0.2)
    ctx = plan_step(step_tokens(s), cfg, gate=0.0, w=1.0, m=1.0)
    n = int(s["mask"].sum())
    sel = high_entropy_mask(_x(s), ctx)
    assert int(sel.sum()) == -(-n // 5) == int(ctx.norm.num_tokens)
    assert s["entropy"][sel].min() >= s["entropy"][s["mask"] & ~sel].max()
    ratio = torch.exp(s["logp"] - s["old"])
    per_token = torch.maximum(-s["adv"] * ratio, -s["adv"] * ratio.clamp(0.8, 1.28))
    per_token = torch.where(s["adv"] < 0, torch.minimum(per_token, -s["adv"] * 10), per_token)
    expected = per_token[sel].sum() / sel.sum()
    torch.testing.assert_close(policy_loss(_x(s), ctx, cfg).loss, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "cfg", [ClipCovLossConfig(clip_ratio=0.02), KLCovLossConfig(kl_ratio=0.02), HighEntropyLossConfig()]
)
def test_baseline_micro_batch_split_gives_the_same_gradient(cfg):
    s = _big_step(rows=16, length=16)
    whole = loss_and_grad(s, cfg, splits=1, seed=1)
    split = loss_and_grad(s, cfg, splits=4, seed=1)
    torch.testing.assert_close(split[1], whole[1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "cfg", [ClipCovLossConfig(), KLCovLossConfig(), HighEntropyLossConfig(), EntropyBonusLossConfig()]
)
def test_baseline_plan_and_loss_have_no_host_sync_on_meta_tensors(cfg):
    s = random_step(1)
    meta = {k: v.to("meta") for k, v in s.items()}
    ctx = plan_step(step_tokens(meta), cfg, gate=0.0, w=1.0, m=1.0)
    logp = meta["logp"].requires_grad_(True)
    x = LossInputs(
        logp, meta["old"], meta["adv"], meta["mask"], meta["uid"], entropy=meta["entropy"], step_entropy=meta["entropy"]
    )
    policy_loss(x, ctx, cfg).loss.backward()
    assert logp.grad.device.type == "meta"


def test_unknown_loss_name_lists_valid_names():
    class Fake:
        name = "ppo-typo"

    with pytest.raises(ValueError, match="valid names: .*stare"):
        policy_loss(None, None, Fake())
