"""The terms every loss can carry on top of its own objective: a KL penalty to the frozen reference policy
(`loss.ref_kl`) and an entropy bonus (`loss.entropy_coef`), STARE included.

    loss = loss_own - entropy_coef x agg(H) + ref_kl.coef x agg(k(log pi, log pi_ref))

Both are aggregated as the loss is (its `agg_mode` and the step's normalisers, over the tokens the loss trained:
80-20's selection, every loss token otherwise), so the micro-batch shares sum to the step's value however the
step is cut; neither is multiplied by the rollout-correction weight (verl adds them the same way:
`policy_loss = pg_loss - entropy_coeff x entropy_loss + kl_loss_coef x kl_loss`, verl/workers/actor/dp_actor.py).

The KL estimators (J. Schulman, "Approximating KL Divergence", 2020, http://joschu.net/blog/kl-approx.html),
with samples from pi_theta and log r = log pi_ref - log pi_theta, estimating KL(pi_theta || pi_ref):

    k1 = -log r                    unbiased, high variance, can be negative
    k2 = (log r)^2 / 2             biased, low variance; its gradient is the true KL's gradient's estimate
    k3 = (r - 1) - log r           unbiased, low variance, >= 0 (verl's low_var_kl: log r clamped to
                                   [-20, 20] before exp, k3 clamped to [-10, 10], as verl/trainer/ppo/core_algos.py)

Pure tensor code: the coefficients are host floats of the config, so nothing here reads the device.
"""

from __future__ import annotations

import torch
from torch import Tensor

from learner.algorithm.losses.base import LossInputs, StepContext
from learner.algorithm.surrogate import aggregate
from stare.config.algo import KLEstimator, SurrogateConfig

K3_LOG_RATIO_CLAMP = 20.0  # verl's low_var_kl: exp of at most e^20
K3_CLAMP = 10.0  # verl's low_var_kl: the estimate itself bounded


def kl_estimate(
    logprobs: Tensor,  # [B, L] log pi_theta, with grad
    ref_logprobs: Tensor,  # [B, L] log pi_ref, detached
    estimator: KLEstimator,
) -> Tensor:  # [B, L]
    """Per-token estimate of KL(pi_theta || pi_ref) (see the module docstring)."""
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator == "k2":
        return 0.5 * (logprobs - ref_logprobs).square()
    if estimator == "k3":
        log_r = (ref_logprobs - logprobs).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
        return (torch.exp(log_r) - log_r - 1.0).clamp(-K3_CLAMP, K3_CLAMP)
    raise ValueError(f"unknown KL estimator {estimator!r}; valid: k1, k2, k3")


def regularize(
    loss: Tensor,  # [] the loss's own value on this micro-batch
    x: LossInputs,
    ctx: StepContext,
    cfg: SurrogateConfig,
    mask: Tensor,  # [B, L] bool, the tokens the loss trained and normalised over
    metrics: dict[str, Tensor],  # the loss's metric sums, added to in place
) -> Tensor:  # [] the loss with the entropy bonus and the reference KL
    """`loss` minus the entropy bonus and plus the reference KL term, as configured; their metric sums:
    entropy_bonus (the aggregate), ref_kl_loss (the aggregate), ref_kl_sum and ref_kl_tokens (the token mean's
    parts)."""
    if cfg.entropy_coef > 0.0:
        assert x.entropy is not None, "loss.entropy_coef needs the training forward's entropy"
        bonus = aggregate(x.entropy, mask, cfg.agg_mode, ctx.norm)
        metrics["entropy_bonus"] = bonus.detach()
        loss = loss - cfg.entropy_coef * bonus
    if cfg.ref_kl is not None:
        assert x.ref_logprobs is not None, "loss.ref_kl needs the reference log-probs of the pre-pass"
        kl = kl_estimate(x.logprobs, x.ref_logprobs, cfg.ref_kl.estimator)  # [B, L]
        kl_loss = aggregate(kl, mask, cfg.agg_mode, ctx.norm)
        metrics["ref_kl_loss"] = kl_loss.detach()
        metrics["ref_kl_sum"] = (kl.detach() * mask).sum()
        metrics["ref_kl_tokens"] = mask.sum()
        if cfg.ref_kl.coef > 0.0:
            loss = loss + cfg.ref_kl.coef * kl_loss
    return loss
