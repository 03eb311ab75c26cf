"""The reference-KL term and the entropy bonus every loss can carry (learner/algorithm/losses/regularizers.py):
each KL estimator's value and gradient worked by hand, verl's k3 clamps, the aggregation of the loss's mode,
80-20's own token set, the split invariance, and the config rules."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from algo_helpers import inputs, loss_and_grad, random_step, step_tokens

from learner.algorithm.losses import policy_loss
from learner.algorithm.losses.high_entropy import high_entropy_mask
from learner.algorithm.losses.regularizers import kl_estimate
from learner.algorithm.step_plan import plan_step
from stare.config import ConfigError, build_config
from stare.config.algo import GrpoLossConfig, HighEntropyLossConfig, RefKLConfig, StareLossConfig

LN2 = math.log(2.0)


@pytest.mark.parametrize(
    ("estimator", "value", "grad"),
    [
        # pi = 0.5, pi_ref = 0.25: log r = log pi_ref - log pi = -ln 2, r = 1/2
        ("k1", LN2, 1.0),  # k1 = -log r = ln 2 = 0.6931; d/dlogp (logp - ref) = 1
        ("k2", LN2**2 / 2, LN2),  # k2 = (ln 2)^2 / 2 = 0.2402; d/dlogp = logp - ref = ln 2
        ("k3", 0.5 + LN2 - 1.0, 0.5),  # k3 = r - 1 - log r = 0.5 - 1 + ln 2 = 0.1931; d/dlogp = 1 - r = 0.5
    ],
)
def test_each_estimator_by_hand(estimator, value, grad):
    logp = torch.tensor([math.log(0.5)], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([math.log(0.25)], dtype=torch.float64)
    k = kl_estimate(logp, ref, estimator)
    k.sum().backward()
    torch.testing.assert_close(k, torch.tensor([value], dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(logp.grad, torch.tensor([grad], dtype=torch.float64), rtol=0, atol=1e-12)


def test_every_estimator_is_zero_where_policy_and_reference_agree():
    logp = torch.log(torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64))
    for estimator in ("k1", "k2", "k3"):
        assert torch.equal(kl_estimate(logp, logp.clone(), estimator), torch.zeros(3, dtype=torch.float64))


def test_k3_is_clamped_as_verl_clamps_it():
    logp = torch.tensor([0.0, -30.0, -12.0], dtype=torch.float64)
    ref = torch.tensor([-40.0, 0.0, 0.0], dtype=torch.float64)
    # log r = -40 -> clamped to -20: e^-20 + 20 - 1 = 19.0000000021 -> clamped to 10
    # log r = +30 -> clamped to 20: e^20 - 20 - 1 = 4.85e8 -> clamped to 10
    # log r = +12: e^12 - 12 - 1 = 162741.79 -> clamped to 10
    assert kl_estimate(logp, ref, "k3").tolist() == [10.0, 10.0, 10.0]
    # inside the clamps: log r = 1: e - 2 = 0.71828
    assert kl_estimate(torch.tensor([-1.0]), torch.tensor([0.0]), "k3").item() == pytest.approx(math.e - 2, abs=1e-6)


def _with_ref(s, ref_shift):
    x = inputs(s)
    return replace(x, ref_logprobs=s["logp"].detach() + ref_shift)


def test_token_mean_adds_coef_times_the_mean_kl_over_loss_tokens():
    s = random_step(4)
    cfg = GrpoLossConfig(ref_kl=RefKLConfig(coef=0.5, estimator="k1"))
    ctx = plan_step(step_tokens(s), cfg, gate=0.0, w=1.0, m=1.0)
    x = _with_ref(s, ref_shift=-0.25)  # k1 = logp - ref = 0.25 on every token
    base = policy_loss(inputs(s), ctx, GrpoLossConfig()).loss
    out = policy_loss(x, ctx, cfg)
    # token-mean of a constant 0.25 is 0.25; the term is 0.5 x 0.25 = 0.125
    torch.testing.assert_close(out.loss, base + 0.125, rtol=0, atol=1e-12)
    n = int(s["mask"].sum())
    assert out.metrics["ref_kl_tokens"].item() == n
    assert out.metrics["ref_kl_sum"].item() == pytest.approx(0.25 * n, abs=1e-9)
    assert out.metrics["ref_kl_loss"].item() == pytest.approx(0.25, abs=1e-12)


def test_seq_mean_token_mean_averages_each_sequence_first():
    s = random_step(5)
    cfg = GrpoLossConfig(agg_mode="seq-mean-token-mean", ref_kl=RefKLConfig(coef=1.0, estimator="k2"))
    ctx = plan_step(step_tokens(s), cfg, gate=0.0, w=1.0, m=1.0)
    # ref shifted by 1 on row 0 only, 0 elsewhere: k2 = 1/2 on row 0's tokens, 0 on the others; per sequence
    # means: row 0 -> 1/2, others -> 0; over the sequences with a loss token (rows - 1: the last row is masked)
    shift = torch.zeros_like(s["logp"])
    shift[0] = -1.0
    x = replace(inputs(s), ref_logprobs=s["logp"].detach() + shift)
    base = policy_loss(inputs(s), ctx, GrpoLossConfig(agg_mode="seq-mean-token-mean")).loss
    seqs = int(s["mask"].any(-1).sum())
    torch.testing.assert_close(policy_loss(x, ctx, cfg).loss, base + 0.5 / seqs, rtol=0, atol=1e-12)


def test_coef_zero_logs_the_kl_and_leaves_the_loss_and_gradient_alone():
    s = random_step(6)
    cfg = StareLossConfig(ref_kl=RefKLConfig(coef=0.0))
    ctx = plan_step(step_tokens(s), cfg, gate=1.0, w=1.3, m=0.7)
    logp = s["logp"].clone().requires_grad_(True)
    x = replace(inputs(s, logp=logp), ref_logprobs=s["old"])
    out = policy_loss(x, ctx, cfg)
    out.loss.backward()
    plain_logp = s["logp"].clone().requires_grad_(True)
    plain = policy_loss(inputs(s, logp=plain_logp), ctx, StareLossConfig())
    plain.loss.backward()
    assert torch.equal(out.loss, plain.loss) and torch.equal(logp.grad, plain_logp.grad)
    assert out.metrics["ref_kl_sum"].item() > 0  # measured all the same


def test_entropy_bonus_combines_with_stare():
    s = random_step(7)
    cfg = StareLossConfig(entropy_coef=0.02)
    ctx = plan_step(step_tokens(s), cfg, gate=1.0, w=1.3, m=0.7)
    stare = policy_loss(inputs(s), ctx, StareLossConfig()).loss
    expected = stare - 0.02 * s["entropy"][s["mask"]].mean()  # token-mean of the entropy over loss tokens
    out = policy_loss(inputs(s), ctx, cfg)
    torch.testing.assert_close(out.loss, expected, rtol=0, atol=1e-12)
    assert out.metrics["entropy_bonus"].item() == pytest.approx(s["entropy"][s["mask"]].mean().item(), abs=1e-12)


def test_80_20_regularizes_only_its_selected_tokens():
    s = random_step(8, rows=16, length=20, tie_decimals=None)
    cfg = HighEntropyLossConfig(ref_kl=RefKLConfig(coef=1.0, estimator="k1"), entropy_coef=0.1)
    ctx = plan_step(step_tokens(s), cfg, gate=0.0, w=1.0, m=1.0)
    x = _with_ref(s, ref_shift=-0.5)  # k1 = 0.5 everywhere
    selected = high_entropy_mask(x, ctx)
    base = policy_loss(inputs(s), ctx, HighEntropyLossConfig()).loss
    # both terms normalised over the selected tokens (ctx.norm counts them): 0.5 - 0.1 x their mean entropy
    expected = base + 0.5 - 0.1 * s["entropy"][selected].mean()
    out = policy_loss(x, ctx, cfg)
    torch.testing.assert_close(out.loss, expected, rtol=0, atol=1e-12)
    assert out.metrics["ref_kl_tokens"].item() == int(selected.sum()) < int(s["mask"].sum())


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batch_split_gives_the_same_loss_and_gradient(agg_mode):
    s = random_step(9, rows=12, length=10)
    s["ref"] = s["old"] - 0.3 * torch.rand(s["old"].shape, dtype=s["old"].dtype)
    cfg = StareLossConfig(agg_mode=agg_mode, ref_kl=RefKLConfig(coef=0.2), entropy_coef=0.05)
    whole = loss_and_grad(s, cfg, splits=1)
    split = loss_and_grad(s, cfg, splits=4)
    torch.testing.assert_close(split[0], whole[0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(split[1], whole[1], rtol=1e-12, atol=1e-14)


def test_config_rules():
    cfg = build_config({}, overrides=["loss.ref_kl.coef=0.01", "loss.ref_kl.estimator=k2", "loss.entropy_coef=0.001"])
    assert cfg.loss.name == "stare" and cfg.loss.ref_kl == RefKLConfig(coef=0.01, estimator="k2")
    assert build_config({}).loss.ref_kl is None and build_config({}).loss.entropy_coef == 0.0  # off by default
    # kept when --algo switches the loss (a shared surrogate setting)
    assert build_config({"loss": {"ref_kl": {"coef": 0.1}}}, algo="grpo").loss.ref_kl.coef == 0.1
    with pytest.raises(ConfigError, match="loss.ref_kl.estimator"):
        build_config({}, overrides=["loss.ref_kl.estimator=low_var_kl"])
    with pytest.raises(ConfigError, match="entropy-bonus loss has loss.coef"):
        build_config({}, overrides=["loss.name=entropy-bonus", "loss.entropy_coef=0.01"])
