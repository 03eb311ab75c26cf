"""GRPO's loss (also DAPO's, with clip-higher and token-mean): the clipped surrogate, nothing selected."""

from __future__ import annotations

from learner.algorithm.losses.base import LossInputs, LossOutputs, StepContext, weighted_surrogate
from learner.algorithm.losses.registry import register_loss
from stare.config.algo import GrpoLossConfig


@register_loss("grpo")
def grpo_loss(x: LossInputs, ctx: StepContext, cfg: GrpoLossConfig) -> LossOutputs:
    loss, metrics = weighted_surrogate(x, ctx, cfg, omega=None)
    return LossOutputs(loss, metrics)
