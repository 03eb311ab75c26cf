"""Once per optimizer step: reduce the whole step's tokens to the decisions every micro-batch shares.

`StepTokens` holds the step's per-token statistics from the pre-step no-grad pass, padded to
[S, L] (S sequences of every micro-batch, gathered over data-parallel ranks by
`learner.engine.collectives.gather_step_tokens`). `plan_step` turns them into a `StepContext`:
normalisers, STARE's surprisal thresholds, the baselines' selections, covariance means. Pure tensor
code; the sort over the step's tokens happens once per step, never per micro-batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from learner.algorithm.losses import StepContext, StepTokens, loss_spec
from learner.algorithm.surrogate import Normalizer
from stare.config.algo import AggMode, SurrogateConfig

__all__ = ["StepTokens", "mean_entropy", "plan_step"]  # StepTokens: its home is losses.base


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

    def as_t(v: float | Tensor) -> Tensor:
        return torch.as_tensor(v, dtype=tokens.old_logprobs.dtype, device=mask.device)

    select = loss_spec(getattr(cfg, "name", None)).select
    extra, loss_mask = select(tokens, cfg, seed) if select is not None else ({}, mask)
    dtype = tokens.old_logprobs.dtype
    norm = Normalizer(
        num_tokens=loss_mask.sum().to(dtype),
        num_seqs=loss_mask.any(-1).sum().to(dtype),
        norm_length=float(cfg.norm_length or 1),
    )
    return StepContext(norm=norm, gate=as_t(gate), w=as_t(w), m=as_t(m), seed=seed, **extra)
