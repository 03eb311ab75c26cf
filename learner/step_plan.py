"""Once per optimizer step: reduce the whole step's tokens to the decisions every micro-batch shares.

`StepTokens` holds the step's per-token statistics from the pre-step no-grad pass, padded to
[S, L] (S sequences of every micro-batch, gathered over data-parallel ranks by
`stare.learner.collectives.gather_step_tokens`). `plan_step` turns them into a `StepContext`:
normalisers, STARE's surprisal thresholds, the baselines' selections, covariance means. Pure tensor
code; the sort over the step's tokens happens once per step, never per micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from stare.config.algo import (
    AggMode,
    ClipCovLossConfig,
    HighEntropyLossConfig,
    KLCovLossConfig,
    StareLossConfig,
    SurrogateConfig,
)
from stare.learner.policy_loss import StepContext
from stare.learner.selection import hash_uniform, in_topk, topk_count, topk_threshold, topk_thresholds
from stare.learner.surrogate import Normalizer


@dataclass(frozen=True)
class StepTokens:
    """The step's tokens, padded; rows whose mask is all False are padding."""

    old_logprobs: Tensor  # [S, L]
    entropy: Tensor  # [S, L] entropy of the policy at each position, detached
    advantages: Tensor  # [S, L]
    token_uid: Tensor  # [S, L] int64
    mask: Tensor  # [S, L] bool

    @staticmethod
    def cat(parts: list["StepTokens"]) -> "StepTokens":
        return StepTokens(*(torch.cat([getattr(p, f) for p in parts]) for f in StepTokens.__dataclass_fields__))


def mean_entropy(entropy: Tensor, mask: Tensor, agg_mode: AggMode) -> Tensor:  # []
    """The gate's batch entropy H_bar: per-sequence means averaged over sequences under
    seq-mean-token-mean, the token mean otherwise (the sum modes would give nats per sequence,
    which no per-token target can be compared with)."""
    m = mask.to(entropy.dtype)
    if agg_mode == "seq-mean-token-mean":
        rows = mask.any(-1)
        per_seq = (entropy * m).sum(-1) / m.sum(-1).clamp(min=1)  # [S]
        return (per_seq * rows).sum() / rows.sum().clamp(min=1)
    return (entropy * m).sum() / m.sum().clamp(min=1)


def _select_stare(tokens: StepTokens, cfg: StareLossConfig, seed: int) -> tuple[dict, Tensor]:
    """STARE: the top-P surprisal thresholds inside each advantage sign, over the whole step."""
    flat, mask = (lambda t: t.reshape(-1)), tokens.mask  # noqa: E731
    members = [flat(mask & (tokens.advantages > 0)), flat(mask & (tokens.advantages < 0))]
    ks = [topk_count(member.sum(), cfg.top_fraction) for member in members]
    pos, neg = topk_thresholds(flat(-tokens.old_logprobs), flat(tokens.token_uid), members, ks)
    return {"pos_threshold": pos, "neg_threshold": neg}, mask


def _select_cov(tokens: StepTokens, cfg: ClipCovLossConfig | KLCovLossConfig, seed: int) -> tuple[dict, Tensor]:
    """Clip-Cov / KL-Cov: the covariance means, and the step's high-covariance selection."""
    flat, mask = (lambda t: t.reshape(-1)), tokens.mask  # noqa: E731
    uid, n, m_f = flat(tokens.token_uid), mask.sum(), mask.to(tokens.old_logprobs.dtype)
    adv_mean = (tokens.advantages * m_f).sum() / n.clamp(min=1)
    logp_mean = (tokens.old_logprobs * m_f).sum() / n.clamp(min=1)
    cov = (tokens.advantages - adv_mean) * (tokens.old_logprobs - logp_mean)  # [S, L]
    extra = {"adv_mean": adv_mean, "logp_mean": logp_mean}
    if isinstance(cfg, ClipCovLossConfig):
        member = flat(mask & (cov > cfg.cov_lb) & (cov < cfg.cov_ub))
        k = torch.minimum(topk_count(n, cfg.clip_ratio, rounding="floor"), member.sum())
        extra["select_threshold"] = topk_threshold(hash_uniform(uid, seed), uid, member, k)
    else:
        k = topk_count(n, cfg.kl_ratio, rounding="floor")
        extra["select_threshold"] = topk_threshold(flat(cov), uid, flat(mask), k)
    return extra, mask


def _select_high_entropy(tokens: StepTokens, cfg: HighEntropyLossConfig, seed: int) -> tuple[dict, Tensor]:
    """80/20: only the step's top-fraction highest-entropy tokens train (and normalise the loss)."""
    flat, mask = (lambda t: t.reshape(-1)), tokens.mask  # noqa: E731
    k = topk_count(mask.sum(), cfg.top_fraction)
    threshold = topk_threshold(flat(tokens.entropy), flat(tokens.token_uid), flat(mask), k)
    return {"select_threshold": threshold}, in_topk(tokens.entropy, tokens.token_uid, mask, threshold)


SelectFn = Callable[[StepTokens, SurrogateConfig, int], "tuple[dict, Tensor]"]

SELECTIONS: dict[str, SelectFn | None] = {
    "stare": _select_stare,
    "grpo": None,
    "entropy-bonus": None,
    "clip-cov": _select_cov,
    "kl-cov": _select_cov,
    "80-20": _select_high_entropy,
}
"""The learner's step-global half of the loss registry (stare.config.algo.LOSS_CONFIGS): per loss
name, what it selects over the whole step before the first micro-batch (None: nothing)."""


def plan_step(
    tokens: StepTokens,
    cfg: SurrogateConfig,
    *,
    gate: float | Tensor,
    w: float | Tensor,
    m: float | Tensor,
    seed: int = 0,
) -> StepContext:
    """Decide the step: normalisers and, per loss, the selection thresholds."""
    mask = tokens.mask
    as_t = lambda v: torch.as_tensor(v, dtype=tokens.old_logprobs.dtype, device=mask.device)  # noqa: E731
    name = getattr(cfg, "name", None)
    if name not in SELECTIONS:
        raise ValueError(f"unknown policy loss {name!r}; valid names: {sorted(SELECTIONS)}")
    select = SELECTIONS[name]
    extra, loss_mask = select(tokens, cfg, seed) if select is not None else ({}, mask)
    dtype = tokens.old_logprobs.dtype
    norm = Normalizer(
        num_tokens=loss_mask.sum().to(dtype),
        num_seqs=loss_mask.any(-1).sum().to(dtype),
        norm_length=float(cfg.norm_length or 1),
    )
    return StepContext(norm=norm, gate=as_t(gate), w=as_t(w), m=as_t(m), seed=seed, **extra)
