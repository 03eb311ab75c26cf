"""What every loss shares: the micro-batch's inputs (`LossInputs`), the step's decisions
(`StepContext`, planned once per step from `StepTokens`), the outputs, and the weighted clipped
surrogate most losses are made of.

Metrics come back as tensors holding *sums* over this micro-batch's tokens (`*_tokens` counts,
`*_sum` totals), so the learner adds them over micro-batches and ranks and divides once per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from learner.algorithm.selection import TopKThreshold
from learner.algorithm.surrogate import Normalizer, aggregate, clipped_surrogate
from stare.config.algo import SurrogateConfig


@dataclass(frozen=True)
class StepTokens:
    """The step's tokens, padded; rows whose mask is all False are padding."""

    old_logprobs: Tensor  # [S, L]
    entropy: Tensor  # [S, L] entropy of the policy at each position, detached
    advantages: Tensor  # [S, L]
    token_uid: Tensor  # [S, L] int64
    mask: Tensor  # [S, L] bool

    @staticmethod
    def cat(parts: list[StepTokens]) -> StepTokens:
        return StepTokens(*(torch.cat([getattr(p, f) for p in parts]) for f in StepTokens.__dataclass_fields__))


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
    is_weight: Tensor | None = (
        None  # [B, L] rollout-correction IS weight (learner/algorithm/rollout_correction.py), detached
    )
    ref_logprobs: Tensor | None = None  # [B, L] log pi_ref of the frozen reference (loss.ref_kl), detached
    selection_logprobs: Tensor | None = None  # [B, L] what ranks STARE's surprisal (loss.selection_keys); None: old


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
    mask: Tensor | None = None  # [B, L] bool, the tokens the loss trained and normalised over; None: the loss mask


def weighted_surrogate(
    x: LossInputs,
    ctx: StepContext,
    cfg: SurrogateConfig,
    omega: Tensor | None,
    mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped surrogate x omega x TIS weight, aggregated; plus clip and TIS metrics."""
    mask = x.mask if mask is None else mask
    per_token, was_clipped = clipped_surrogate(
        x.logprobs,
        x.old_logprobs,
        x.advantages,
        eps_low=cfg.eps_low,
        eps_high=cfg.eps_high,
        dual_clip_c=cfg.dual_clip_c,
    )  # [B, L]
    if omega is not None:
        per_token = per_token * omega
    metrics = {"clipped_tokens": (was_clipped & mask).sum()}
    return corrected_aggregate(per_token, x, ctx, cfg, mask, metrics), metrics


def corrected_aggregate(
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
