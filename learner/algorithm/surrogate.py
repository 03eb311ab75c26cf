"""The per-token clipped surrogate, the ratio's statistics, and loss aggregation.

Pure tensor functions; no host synchronisation. Normalisers (token and sequence counts) are
passed in, reduced once per optimizer step over every micro-batch and data-parallel rank, so the
sum of micro-batch losses is the loss of the whole step however it is split.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from stare.config.algo import AggMode

_MAX_LOG_RATIO = 20.0


def importance_ratio(
    logprobs: Tensor,  # [B, L]
    old_logprobs: Tensor,  # [B, L]
) -> Tensor:  # [B, L]
    """pi_theta / pi_old per token, with the log-ratio clamped so exp cannot overflow."""
    return torch.exp((logprobs - old_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))


def clipped_surrogate(
    logprobs: Tensor,  # [B, L] current policy, with grad
    old_logprobs: Tensor,  # [B, L] at the start of the step, detached
    advantages: Tensor,  # [B, L]
    *,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None,
) -> tuple[Tensor, Tensor]:  # loss [B, L], clipped [B, L] bool
    """Dual-clip PPO/GRPO with decoupled clip range, per token (to be minimised):

    l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)),  and for A < 0: min(l, -A c).
    """
    ratio = importance_ratio(logprobs, old_logprobs)  # [B, L]
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    was_clipped = clipped > unclipped
    if dual_clip_c is not None:
        lower = -advantages * dual_clip_c
        dual = (advantages < 0) & (loss > lower)
        loss = torch.where(dual, lower, loss)
        was_clipped = was_clipped | dual
    return loss, was_clipped


def ratio_stats(
    logprobs: Tensor,  # [B, L] current policy (its gradient is not used)
    old_logprobs: Tensor,  # [B, L] at the start of the batch
    advantages: Tensor,  # [B, L]
    mask: Tensor,  # [B, L] bool
    *,
    eps_low: float,
    eps_high: float,
) -> dict[str, Tensor]:  # each [] , sums over the masked tokens
    """Sums that say how far an update has moved the policy off the batch's start (summed over
    micro-batches and ranks, divided by the update's tokens once per update):

        clip_low_tokens:  A < 0 and r < 1 - eps_low  (the lower clip holds the token's gradient)
        clip_high_tokens: A > 0 and r > 1 + eps_high (the upper clip holds it)
        approx_kl_sum:    (r - 1) - log r, Schulman's k3 estimate of KL(pi_old || pi_theta)
        ratio_sum, ratio_sq_sum: r and r^2 (the ratio's mean and spread)

    The low/high split is TRL's `clip_ratio/low_mean`, `clip_ratio/high_mean`."""
    log_r = (logprobs.detach() - old_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)  # [B, L]
    r = torch.exp(log_r)
    m = mask.to(r.dtype)
    return {
        "clip_low_tokens": (mask & (advantages < 0) & (r < 1.0 - eps_low)).sum(),
        "clip_high_tokens": (mask & (advantages > 0) & (r > 1.0 + eps_high)).sum(),
        "approx_kl_sum": (((r - 1.0) - log_r) * m).sum(),
        "ratio_sum": (r * m).sum(),
        "ratio_sq_sum": (r * r * m).sum(),
    }


class Normalizer(NamedTuple):
    """Counts of the whole step (all micro-batches, all ranks), reduced once per step."""

    num_tokens: Tensor  # [] loss tokens
    num_seqs: Tensor  # [] sequences with at least one loss token
    norm_length: float  # constant divisor for seq-mean-token-sum-norm


def aggregate(
    values: Tensor,  # [B, L] per-token values
    mask: Tensor,  # [B, L] bool
    mode: AggMode,
    norm: Normalizer,
) -> Tensor:  # []
    """This micro-batch's share of the step's aggregate (shares sum to the aggregate of the step).

    token-mean: sum over tokens / step tokens. seq-mean-token-sum: per-sequence sums, averaged over
    the step's sequences. seq-mean-token-mean: per-sequence means, averaged likewise.
    seq-mean-token-sum-norm (Dr. GRPO): per-sequence sums / norm_length, averaged likewise.
    A fully masked row contributes nothing and is not counted as a sequence.
    """
    m = mask.to(values.dtype)
    masked = values * m  # [B, L]
    if mode == "token-mean":
        return masked.sum() / norm.num_tokens.clamp(min=1)
    num_seqs = norm.num_seqs.clamp(min=1)
    if mode == "seq-mean-token-sum":
        return masked.sum() / num_seqs
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(-1) / m.sum(-1).clamp(min=1)  # [B]
        return per_seq.sum() / num_seqs
    if mode == "seq-mean-token-sum-norm":
        return masked.sum() / (num_seqs * norm.norm_length)
    raise ValueError(f"unknown agg_mode {mode!r}")


def local_counts(mask: Tensor) -> Tensor:  # [2]: tokens, sequences with a token
    """This micro-batch's contribution to the step's Normalizer (summed, then all-reduced)."""
    return torch.stack([mask.sum(), mask.any(-1).sum()]).to(torch.float64)
