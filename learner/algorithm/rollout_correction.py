"""Rollout correction: truncated and masked importance sampling between the behaviour policy (the
rollout engine's recorded log-probs) and the learner's policy at the batch start.

Once per step, on the step's [S, L] tensors, before the selections and normalisers are planned:
`rollout_correction` returns each token's IS weight (multiplied into its loss term, with STARE's
omega) and which tokens stay in the loss (the masked ones leave its normalisers too, as verl's
rejection mask does), plus the sums of the step's mismatch metrics. Every quantity of a row depends
on that row only, so a rank computes its own rows without a collective. Pure tensor code, no host
sync. Formulas and sources: docs/algorithm.md, "Rollout correction".
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from stare.config.algo import RolloutCorrectionConfig

SAFETY_BOUND = 20.0  # |log rho| (token or sequence) is clamped here before exp, as verl's rollout_corr does
METRIC_SUMS = ("tokens", "k1_sum", "k3_sum", "masked_tokens", "truncated_tokens", "is_weight_sum")


class Correction(NamedTuple):
    weight: Tensor | None  # [S, L] detached IS weight (None: no truncated IS)
    keep: Tensor  # [S, L] bool, tokens that stay in the loss (the input mask without the masked ones)
    sums: Tensor  # [6] float64, METRIC_SUMS over the input mask's tokens


def rollout_correction(
    old_logprobs: Tensor,  # [S, L] learner, batch start
    rollout_logprobs: Tensor,  # [S, L] behaviour policy (the rollout engine's, at its weight version)
    mask: Tensor,  # [S, L] bool, the loss tokens
    cfg: RolloutCorrectionConfig,
) -> Correction:
    m = mask.to(old_logprobs.dtype)
    log_rho = ((old_logprobs - rollout_logprobs.to(old_logprobs.dtype)) * m).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    seq_log_rho = (log_rho * m).sum(-1, keepdim=True).clamp(-SAFETY_BOUND, SAFETY_BOUND)  # [S, 1]
    keep = mask
    if cfg.mask_level is not None:
        if cfg.mask_level == "token":
            stat = log_rho  # [S, L]
        elif cfg.mask_level == "sequence":
            stat = seq_log_rho  # [S, 1]
        else:  # geometric: the mean log-ratio of the sequence's tokens
            stat = seq_log_rho / m.sum(-1, keepdim=True).clamp(min=1)
        keep = mask & (stat >= math.log(cfg.low)) & (stat <= math.log(cfg.mask_high))
    weight, truncated = None, torch.zeros_like(mask)
    if cfg.is_level is not None:
        level = log_rho if cfg.is_level == "token" else seq_log_rho.expand_as(log_rho)  # [S, L]
        truncated = mask & (level > math.log(cfg.is_cap))
        weight = torch.exp(level).clamp(max=cfg.is_cap).detach()
    rho = torch.exp(log_rho)
    sums = torch.stack(
        [
            m.sum(),
            (-log_rho * m).sum(),  # k1 = log(pi_rollout / pi_learner): KL(rollout || learner) from rollout samples
            ((rho - 1.0 - log_rho) * m).sum(),  # k3 = rho - 1 - log rho
            (mask & ~keep).sum().to(m.dtype),
            truncated.sum().to(m.dtype),
            ((weight if weight is not None else torch.ones_like(m)) * keep.to(m.dtype)).sum(),
        ]
    ).to(torch.float64)
    return Correction(weight, keep, sums)


def correction_metrics(sums: list[float]) -> dict[str, float]:
    """The step's metrics from its reduced sums (every rank): per-token means over the loss tokens
    before masking; is_weight_mean over the kept tokens (1 without truncated IS)."""
    s = dict(zip(METRIC_SUMS, sums))
    tokens, kept = max(s["tokens"], 1.0), max(s["tokens"] - s["masked_tokens"], 1.0)
    return {
        "rollout_mismatch_k1": s["k1_sum"] / tokens,
        "rollout_mismatch_k3": s["k3_sum"] / tokens,
        "rollout_masked_fraction": s["masked_tokens"] / tokens,
        "rollout_truncated_fraction": s["truncated_tokens"] / tokens,
        "rollout_is_weight_mean": s["is_weight_sum"] / kept,
    }
