"""The entropy bonus: GRPO minus coef x the aggregated token entropy of the training forward."""

from __future__ import annotations

from learner.algorithm.losses.base import LossInputs, LossOutputs, StepContext, weighted_surrogate
from learner.algorithm.losses.registry import register_loss
from learner.algorithm.surrogate import aggregate
from stare.config.algo import EntropyBonusLossConfig


@register_loss("entropy-bonus")
def entropy_bonus_loss(x: LossInputs, ctx: StepContext, cfg: EntropyBonusLossConfig) -> LossOutputs:
    assert x.entropy is not None, "the entropy-bonus loss needs the training forward's entropy"
    pg, metrics = weighted_surrogate(x, ctx, cfg, omega=None)
    bonus = aggregate(x.entropy, x.mask, cfg.agg_mode, ctx.norm)
    metrics["entropy_bonus"] = bonus.detach()
    return LossOutputs(pg - cfg.coef * bonus, metrics)
