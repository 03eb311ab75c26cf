"""The 80/20 update (Wang et al. 2025, "Beyond the 80/20 Rule"): only the step's top fraction of
tokens by entropy get a policy gradient, and the loss is normalised over those tokens."""

from __future__ import annotations

from torch import Tensor

from learner.algorithm.losses.base import LossInputs, LossOutputs, StepContext, StepTokens, weighted_surrogate
from learner.algorithm.losses.registry import register_loss
from learner.algorithm.selection import TopKThreshold, in_topk, topk_count, topk_threshold
from stare.config.algo import HighEntropyLossConfig


def select_high_entropy(
    tokens: StepTokens, cfg: HighEntropyLossConfig, seed: int
) -> tuple[dict[str, TopKThreshold], Tensor]:
    """80/20: only the step's top-fraction highest-entropy tokens train (and normalise the loss)."""
    mask = tokens.mask
    k = topk_count(mask.sum(), cfg.top_fraction)
    threshold = topk_threshold(tokens.entropy.reshape(-1), tokens.token_uid.reshape(-1), mask.reshape(-1), k)
    return {"select_threshold": threshold}, in_topk(tokens.entropy, tokens.token_uid, mask, threshold)


def high_entropy_mask(x: LossInputs, ctx: StepContext) -> Tensor:  # [B, L] bool
    """The 80/20 update's training tokens: the step's top fraction by entropy."""
    assert x.step_entropy is not None, "the 80-20 loss needs step_entropy"
    assert ctx.select_threshold is not None, "plan_step did not set the 80-20 selection"
    return in_topk(x.step_entropy, x.token_uid, x.mask, ctx.select_threshold)


@register_loss("80-20", select=select_high_entropy)
def high_entropy_loss(x: LossInputs, ctx: StepContext, cfg: HighEntropyLossConfig) -> LossOutputs:
    """Policy gradient on the high-entropy tokens only; ctx.norm counts those tokens."""
    selected = high_entropy_mask(x, ctx)
    loss, metrics = weighted_surrogate(x, ctx, cfg, omega=None, mask=selected)
    metrics["entropy_selected_tokens"] = selected.sum()
    return LossOutputs(loss, metrics, mask=selected)
