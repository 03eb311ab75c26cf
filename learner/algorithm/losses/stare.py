"""STARE: the top-P surprisal tokens inside each advantage sign, over the whole step (L+ and L-),
reweighted: omega = W on L+, M on L- (variant C2), 1 elsewhere, and 1 everywhere while the gate is off."""

from __future__ import annotations

import torch
from torch import Tensor

from learner.algorithm.losses.base import LossInputs, LossOutputs, StepContext, StepTokens, weighted_surrogate
from learner.algorithm.losses.registry import register_loss
from learner.algorithm.selection import TopKThreshold, in_topk, topk_count, topk_thresholds
from stare.config.algo import StareLossConfig


def select_stare(tokens: StepTokens, cfg: StareLossConfig, seed: int) -> tuple[dict[str, TopKThreshold], Tensor]:
    """STARE: the top-P surprisal thresholds inside each advantage sign, over the whole step."""
    mask = tokens.mask
    members = [(mask & (tokens.advantages > 0)).reshape(-1), (mask & (tokens.advantages < 0)).reshape(-1)]
    ks = [topk_count(member.sum(), cfg.top_fraction) for member in members]
    pos, neg = topk_thresholds((-tokens.old_logprobs).reshape(-1), tokens.token_uid.reshape(-1), members, ks)
    return {"pos_threshold": pos, "neg_threshold": neg}, mask


def surprisal_selection(x: LossInputs, ctx: StepContext) -> tuple[Tensor, Tensor]:  # L+ [B, L], L- [B, L]
    """Masks of the entropy-critical tokens: top surprisal inside each advantage sign."""
    assert ctx.pos_threshold is not None and ctx.neg_threshold is not None, "plan_step did not set STARE thresholds"
    surprisal = -(x.old_logprobs if x.selection_logprobs is None else x.selection_logprobs)
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


@register_loss("stare", select=select_stare)
def stare_loss(x: LossInputs, ctx: StepContext, cfg: StareLossConfig) -> LossOutputs:
    pos, neg = surprisal_selection(x, ctx)
    omega = stare_token_weights(pos, neg, ctx, cfg.variant, x.logprobs.dtype)
    loss, metrics = weighted_surrogate(x, ctx, cfg, omega)
    metrics["critical_pos_tokens"] = pos.sum()
    metrics["critical_neg_tokens"] = neg.sum()
    metrics["omega_sum"] = (omega * x.mask).sum()
    return LossOutputs(loss, metrics)
