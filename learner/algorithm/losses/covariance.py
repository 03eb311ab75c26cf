"""Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
Language Models"): the step's tokens ranked by the centred covariance of advantage and log-prob;
Clip-Cov detaches a random share of the high-covariance ones, KL-Cov adds a |log-ratio| penalty on the top ones."""

from __future__ import annotations

import torch
from torch import Tensor

from learner.algorithm.losses.base import (
    LossInputs,
    LossOutputs,
    StepContext,
    StepTokens,
    corrected_aggregate,
    weighted_surrogate,
)
from learner.algorithm.losses.registry import register_loss
from learner.algorithm.selection import TopKThreshold, hash_uniform, in_topk, topk_count, topk_threshold
from learner.algorithm.surrogate import importance_ratio
from stare.config.algo import ClipCovLossConfig, KLCovLossConfig


def select_cov(
    tokens: StepTokens, cfg: ClipCovLossConfig | KLCovLossConfig, seed: int
) -> tuple[dict[str, Tensor | TopKThreshold], Tensor]:
    """Clip-Cov / KL-Cov: the covariance means, and the step's high-covariance selection."""
    mask = tokens.mask
    uid, n, m_f = tokens.token_uid.reshape(-1), mask.sum(), mask.to(tokens.old_logprobs.dtype)
    adv_mean = (tokens.advantages * m_f).sum() / n.clamp(min=1)
    logp_mean = (tokens.old_logprobs * m_f).sum() / n.clamp(min=1)
    cov = (tokens.advantages - adv_mean) * (tokens.old_logprobs - logp_mean)  # [S, L]
    extra: dict[str, Tensor | TopKThreshold] = {"adv_mean": adv_mean, "logp_mean": logp_mean}
    if isinstance(cfg, ClipCovLossConfig):
        member = (mask & (cov > cfg.cov_lb) & (cov < cfg.cov_ub)).reshape(-1)
        k = torch.minimum(topk_count(n, cfg.clip_ratio, rounding="floor"), member.sum())
        extra["select_threshold"] = topk_threshold(hash_uniform(uid, seed), uid, member, k)
    else:
        k = topk_count(n, cfg.kl_ratio, rounding="floor")
        extra["select_threshold"] = topk_threshold(cov.reshape(-1), uid, mask.reshape(-1), k)
    return extra, mask


def centered_covariance(x: LossInputs, ctx: StepContext) -> Tensor:  # [B, L]
    """(A - mean A) x (logp - mean logp) per token, centred over the step (Cui et al. 2025)."""
    assert ctx.adv_mean is not None and ctx.logp_mean is not None, "plan_step did not set covariance means"
    return (x.advantages - ctx.adv_mean) * (x.old_logprobs - ctx.logp_mean)


def clip_cov_candidates(cov: Tensor, mask: Tensor, cfg: ClipCovLossConfig) -> Tensor:  # [B, L] bool
    return mask & (cov > cfg.cov_lb) & (cov < cfg.cov_ub)


@register_loss("clip-cov", select=select_cov)
def clip_cov_loss(x: LossInputs, ctx: StepContext, cfg: ClipCovLossConfig) -> LossOutputs:
    """Detach the gradient of the randomly drawn high-covariance tokens."""
    assert ctx.select_threshold is not None, "plan_step did not set the Clip-Cov selection"
    cov = centered_covariance(x, ctx)
    draw = hash_uniform(x.token_uid, ctx.seed)
    detached = in_topk(draw, x.token_uid, clip_cov_candidates(cov, x.mask, cfg), ctx.select_threshold)
    keep = (~detached).to(x.logprobs.dtype)
    loss, metrics = weighted_surrogate(x, ctx, cfg, omega=keep)
    metrics["cov_selected_tokens"] = detached.sum()
    return LossOutputs(loss, metrics)


@register_loss("kl-cov", select=select_cov)
def kl_cov_loss(x: LossInputs, ctx: StepContext, cfg: KLCovLossConfig) -> LossOutputs:
    """-A r (no clipping), plus kl_coef |logp - old_logp| on the top-covariance tokens."""
    assert ctx.select_threshold is not None, "plan_step did not set the KL-Cov selection"
    cov = centered_covariance(x, ctx)
    selected = in_topk(cov, x.token_uid, x.mask, ctx.select_threshold)
    per_token = -x.advantages * importance_ratio(x.logprobs, x.old_logprobs)  # [B, L]
    kl = (x.logprobs - x.old_logprobs).abs()  # [B, L]
    per_token = per_token + selected.to(per_token.dtype) * cfg.kl_coef * kl
    metrics: dict[str, Tensor] = {"cov_selected_tokens": selected.sum()}
    return LossOutputs(corrected_aggregate(per_token, x, ctx, cfg, x.mask, metrics), metrics)
