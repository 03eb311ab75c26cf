"""Once per optimizer step: reduce the whole step's tokens to the decisions every micro-batch shares.

`StepTokens` holds the step's per-token statistics from the pre-step no-grad pass, padded to
[S, L] (S sequences of every micro-batch, gathered over data-parallel ranks by
`stare.learner.collectives.gather_step_tokens`). `plan_step` turns them into a `StepContext`:
normalisers, STARE's surprisal thresholds, the baselines' selections, covariance means. Pure tensor
code; the sort over the step's tokens happens once per step, never per micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from stare.algo_config import (
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
    device = mask.device
    dtype = tokens.old_logprobs.dtype
    n = mask.sum()
    as_t = lambda v: torch.as_tensor(v, dtype=dtype, device=device)  # noqa: E731
    flat = lambda t: t.reshape(-1)  # noqa: E731
    uid = flat(tokens.token_uid)
    loss_mask = mask
    extra: dict = {}

    if isinstance(cfg, StareLossConfig):
        members = [flat(mask & (tokens.advantages > 0)), flat(mask & (tokens.advantages < 0))]
        ks = [topk_count(member.sum(), cfg.top_fraction) for member in members]
        pos, neg = topk_thresholds(flat(-tokens.old_logprobs), uid, members, ks)
        extra.update(pos_threshold=pos, neg_threshold=neg)
    elif isinstance(cfg, (ClipCovLossConfig, KLCovLossConfig)):
        m_f = mask.to(dtype)
        adv_mean = (tokens.advantages * m_f).sum() / n.clamp(min=1)
        logp_mean = (tokens.old_logprobs * m_f).sum() / n.clamp(min=1)
        cov = (tokens.advantages - adv_mean) * (tokens.old_logprobs - logp_mean)  # [S, L]
        extra.update(adv_mean=adv_mean, logp_mean=logp_mean)
        if isinstance(cfg, ClipCovLossConfig):
            member = flat(mask & (cov > cfg.cov_lb) & (cov < cfg.cov_ub))
            k = torch.minimum(topk_count(n, cfg.clip_ratio, rounding="floor"), member.sum())
            extra["select_threshold"] = topk_threshold(hash_uniform(uid, seed), uid, member, k)
        else:
            k = topk_count(n, cfg.kl_ratio, rounding="floor")
            extra["select_threshold"] = topk_threshold(flat(cov), uid, flat(mask), k)
    elif isinstance(cfg, HighEntropyLossConfig):
        k = topk_count(n, cfg.top_fraction)
        threshold = topk_threshold(flat(tokens.entropy), uid, flat(mask), k)
        extra["select_threshold"] = threshold
        loss_mask = in_topk(tokens.entropy, tokens.token_uid, mask, threshold)

    norm = Normalizer(
        num_tokens=loss_mask.sum().to(dtype),
        num_seqs=loss_mask.any(-1).sum().to(dtype),
        norm_length=float(cfg.norm_length or 1),
    )
    return StepContext(norm=norm, gate=as_t(gate), w=as_t(w), m=as_t(m), seed=seed, **extra)
