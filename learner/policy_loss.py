"""Policy losses: STARE and the baselines, as pure functions over one micro-batch.

`policy_loss(inputs, ctx, config)` dispatches on `config.name` through `POLICY_LOSSES`. Everything
that depends on the whole optimizer step (selection thresholds, normalisers, the gate, W and M)
arrives in `StepContext`, computed once per step by `stare.learner.step_plan.plan_step`; the
per-micro-batch work is elementwise and has no host synchronisation.

Metrics come back as tensors holding *sums* over this micro-batch's tokens (`*_tokens` counts,
`*_sum` totals), so the learner adds them over micro-batches and ranks and divides once per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from stare.config.algo import (
    ClipCovLossConfig,
    EntropyBonusLossConfig,
    GrpoLossConfig,
    HighEntropyLossConfig,
    KLCovLossConfig,
    StareLossConfig,
    SurrogateConfig,
)
from stare.learner.selection import TopKThreshold, hash_uniform, in_topk
from stare.learner.surrogate import (
    Normalizer,
    aggregate,
    clipped_surrogate,
    importance_ratio,
    ratio_stats,
)


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch. Every tensor is [B, L] over the same response positions."""

    logprobs: Tensor  # [B, L] log pi_theta(o_t), with grad
    old_logprobs: Tensor  # [B, L] log-probs at the start of the step (detached); surprisal = -old_logprobs
    advantages: Tensor  # [B, L] sequence advantage on each response token
    mask: Tensor  # [B, L] bool, tokens that count in the loss
    token_uid: Tensor  # [B, L] int64 global token id of the step (sample index x max length + position)
    entropy: Tensor | None = None  # [B, L] entropy of pi_theta(.|context), with grad (entropy bonus)
    step_entropy: Tensor | None = None  # [B, L] entropy at the start of the step, detached (80/20 selection)
    rollout_logprobs: Tensor | None = None  # [B, L] the rollout engine's log-probs
    is_weight: Tensor | None = None  # [B, L] rollout-correction IS weight (learner/rollout_correction.py), detached


@dataclass(frozen=True)
class StepContext:
    """What the whole step decided, applied identically to every micro-batch."""

    norm: Normalizer
    gate: Tensor  # [] 1.0 when STARE's reweighting is on this step, else 0.0
    w: Tensor  # [] weight on L+
    m: Tensor  # [] weight on L- (C2)
    pos_threshold: TopKThreshold | None = None  # STARE: L+ inside A > 0, keyed by surprisal
    neg_threshold: TopKThreshold | None = None  # STARE: L- inside A < 0
    select_threshold: TopKThreshold | None = None  # Clip-Cov / KL-Cov / 80-20 selections
    adv_mean: Tensor | None = None  # [] step token-mean advantage (covariance centring)
    logp_mean: Tensor | None = None  # [] step token-mean old log-prob (covariance centring)
    seed: int = 0  # Clip-Cov's random draw


@dataclass(frozen=True)
class LossOutputs:
    loss: Tensor  # [] this micro-batch's share of the step loss
    metrics: dict[str, Tensor] = field(default_factory=dict)  # sums over this micro-batch


def surprisal_selection(x: LossInputs, ctx: StepContext) -> tuple[Tensor, Tensor]:  # L+ [B, L], L- [B, L]
    """Masks of the entropy-critical tokens: top surprisal inside each advantage sign."""
    assert ctx.pos_threshold is not None and ctx.neg_threshold is not None, "plan_step did not set STARE thresholds"
    surprisal = -x.old_logprobs
    pos = in_topk(surprisal, x.token_uid, x.mask & (x.advantages > 0), ctx.pos_threshold)
    neg = in_topk(surprisal, x.token_uid, x.mask & (x.advantages < 0), ctx.neg_threshold)
    return pos, neg


def stare_token_weights(
    pos: Tensor,  # [B, L] bool, L+
    neg: Tensor,  # [B, L] bool, L-
    ctx: StepContext,
    variant: str,
    dtype: torch.dtype,
) -> Tensor:  # [B, L] omega > 0
    """omega = W on L+, M on L- (C2 only), 1 elsewhere; 1 everywhere while the gate is off."""
    tilt = (ctx.w - 1.0) * pos.to(dtype)
    if variant == "C2":
        tilt = tilt + (ctx.m - 1.0) * neg.to(dtype)
    return 1.0 + ctx.gate * tilt


def _weighted_surrogate(
    x: LossInputs,
    ctx: StepContext,
    cfg: SurrogateConfig,
    omega: Tensor | None,
    mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate x omega x TIS weight, aggregated; plus clip and TIS metrics."""
    mask = x.mask if mask is None else mask
    per_token, was_clipped = clipped_surrogate(
        x.logprobs, x.old_logprobs, x.advantages,
        eps_low=cfg.eps_low, eps_high=cfg.eps_high, dual_clip_c=cfg.dual_clip_c,
    )  # [B, L]
    if omega is not None:
        per_token = per_token * omega
    metrics = {"clipped_tokens": (was_clipped & mask).sum()}
    return _corrected_aggregate(per_token, x, ctx, cfg, mask, metrics), metrics


def _corrected_aggregate(
    per_token: Tensor,  # [B, L]
    x: LossInputs,
    ctx: StepContext,
    cfg: SurrogateConfig,
    mask: Tensor,  # [B, L] bool
    metrics: dict[str, Tensor],
) -> Tensor:  # []
    """Apply the rollout-correction IS weight (when the step has one), then aggregate."""
    if x.is_weight is not None:
        per_token = per_token * x.is_weight
    return aggregate(per_token, mask, cfg.agg_mode, ctx.norm)


def grpo_loss(x: LossInputs, ctx: StepContext, cfg: GrpoLossConfig) -> LossOutputs:
    loss, metrics = _weighted_surrogate(x, ctx, cfg, omega=None)
    return LossOutputs(loss, metrics)


def stare_loss(x: LossInputs, ctx: StepContext, cfg: StareLossConfig) -> LossOutputs:
    pos, neg = surprisal_selection(x, ctx)
    omega = stare_token_weights(pos, neg, ctx, cfg.variant, x.logprobs.dtype)
    loss, metrics = _weighted_surrogate(x, ctx, cfg, omega)
    metrics["critical_pos_tokens"] = pos.sum()
    metrics["critical_neg_tokens"] = neg.sum()
    metrics["omega_sum"] = (omega * x.mask).sum()
    return LossOutputs(loss, metrics)


def entropy_bonus_loss(x: LossInputs, ctx: StepContext, cfg: EntropyBonusLossConfig) -> LossOutputs:
    assert x.entropy is not None, "the entropy-bonus loss needs the training forward's entropy"
    pg, metrics = _weighted_surrogate(x, ctx, cfg, omega=None)
    bonus = aggregate(x.entropy, x.mask, cfg.agg_mode, ctx.norm)
    metrics["entropy_bonus"] = bonus.detach()
    return LossOutputs(pg - cfg.coef * bonus, metrics)


def centered_covariance(x: LossInputs, ctx: StepContext) -> Tensor:  # [B, L]
    """(A - mean A) x (logp - mean logp) per token, centred over the step (Cui et al. 2025)."""
    assert ctx.adv_mean is not None and ctx.logp_mean is not None, "plan_step did not set covariance means"
    return (x.advantages - ctx.adv_mean) * (x.old_logprobs - ctx.logp_mean)


def clip_cov_candidates(cov: Tensor, mask: Tensor, cfg: ClipCovLossConfig) -> Tensor:  # [B, L] bool
    return mask & (cov > cfg.cov_lb) & (cov < cfg.cov_ub)


def clip_cov_loss(x: LossInputs, ctx: StepContext, cfg: ClipCovLossConfig) -> LossOutputs:
    """Detach the gradient of the randomly drawn high-covariance tokens."""
    assert ctx.select_threshold is not None, "plan_step did not set the Clip-Cov selection"
    cov = centered_covariance(x, ctx)
    draw = hash_uniform(x.token_uid, ctx.seed)
    detached = in_topk(draw, x.token_uid, clip_cov_candidates(cov, x.mask, cfg), ctx.select_threshold)
    keep = (~detached).to(x.logprobs.dtype)
    loss, metrics = _weighted_surrogate(x, ctx, cfg, omega=keep)
    metrics["cov_selected_tokens"] = detached.sum()
    return LossOutputs(loss, metrics)


def kl_cov_loss(x: LossInputs, ctx: StepContext, cfg: KLCovLossConfig) -> LossOutputs:
    """-A r (no clipping), plus kl_coef |logp - old_logp| on the top-covariance tokens."""
    assert ctx.select_threshold is not None, "plan_step did not set the KL-Cov selection"
    cov = centered_covariance(x, ctx)
    selected = in_topk(cov, x.token_uid, x.mask, ctx.select_threshold)
    per_token = -x.advantages * importance_ratio(x.logprobs, x.old_logprobs)  # [B, L]
    kl = (x.logprobs - x.old_logprobs).abs()  # [B, L]
    per_token = per_token + selected.to(per_token.dtype) * cfg.kl_coef * kl
    metrics: dict[str, Tensor] = {"cov_selected_tokens": selected.sum()}
    return LossOutputs(_corrected_aggregate(per_token, x, ctx, cfg, x.mask, metrics), metrics)


def high_entropy_mask(x: LossInputs, ctx: StepContext) -> Tensor:  # [B, L] bool
    """The 80/20 update's training tokens: the step's top fraction by entropy."""
    assert x.step_entropy is not None, "the 80-20 loss needs step_entropy"
    assert ctx.select_threshold is not None, "plan_step did not set the 80-20 selection"
    return in_topk(x.step_entropy, x.token_uid, x.mask, ctx.select_threshold)


def high_entropy_loss(x: LossInputs, ctx: StepContext, cfg: HighEntropyLossConfig) -> LossOutputs:
    """Policy gradient on the high-entropy tokens only; ctx.norm counts those tokens."""
    selected = high_entropy_mask(x, ctx)
    loss, metrics = _weighted_surrogate(x, ctx, cfg, omega=None, mask=selected)
    metrics["entropy_selected_tokens"] = selected.sum()
    return LossOutputs(loss, metrics)


PolicyLossFn = Callable[[LossInputs, StepContext, SurrogateConfig], LossOutputs]

POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "grpo": grpo_loss,
    "stare": stare_loss,
    "entropy-bonus": entropy_bonus_loss,
    "clip-cov": clip_cov_loss,
    "kl-cov": kl_cov_loss,
    "80-20": high_entropy_loss,
}


def policy_loss(x: LossInputs, ctx: StepContext, cfg: SurrogateConfig) -> LossOutputs:
    name = getattr(cfg, "name", None)
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; valid names: {sorted(POLICY_LOSSES)}")
    out = POLICY_LOSSES[name](x, ctx, cfg)
    out.metrics.update(ratio_stats(x.logprobs, x.old_logprobs, x.advantages, x.mask,
                                   eps_low=cfg.eps_low, eps_high=cfg.eps_high))
    return out
