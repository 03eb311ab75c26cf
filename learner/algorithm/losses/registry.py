"""The learner's loss registry: one entry per loss, made by `@register_loss(name, select=...)` on the
loss function in the loss's own module.

An entry has the loss function (one micro-batch -> loss and metric sums) and, where the loss picks
tokens over the whole optimizer step (STARE's surprisal thresholds, the covariance and entropy
selections), its `select`: the step's tokens -> the thresholds every micro-batch shares and the
mask the loss normalises over. The config half of a loss (its typed section and `--algo` presets)
is `stare.config.algo.LOSS_CONFIGS`, read by every process without importing torch; the two are
checked to name the same losses (tests/learner/test_loss_registry.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from learner.algorithm.losses.base import LossOutputs
from learner.algorithm.losses.regularizers import regularize
from learner.algorithm.surrogate import ratio_stats

if TYPE_CHECKING:
    from torch import Tensor

    from learner.algorithm.losses.base import LossInputs, StepContext, StepTokens
    from stare.config.algo import SurrogateConfig

LossFn = Callable[["LossInputs", "StepContext", Any], "LossOutputs"]
SelectFn = Callable[["StepTokens", Any, int], "tuple[dict[str, Any], Tensor]"]


@dataclass(frozen=True)
class LossSpec:
    name: str
    loss: LossFn
    select: SelectFn | None = None  # None: nothing selected over the step; every masked token trains


LOSSES: dict[str, LossSpec] = {}


def register_loss(name: str, *, select: SelectFn | None = None) -> Callable[[LossFn], LossFn]:
    """Register the decorated function as the loss `name` (and its step-global selection)."""

    def add(fn: LossFn) -> LossFn:
        if name in LOSSES:
            raise ValueError(f"loss {name!r} is registered twice ({LOSSES[name].loss.__module__}, {fn.__module__})")
        LOSSES[name] = LossSpec(name, fn, select)
        return fn

    return add


def loss_spec(name: str | None) -> LossSpec:
    if name not in LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; valid names: {sorted(LOSSES)}")
    return LOSSES[name]


def policy_loss(x: LossInputs, ctx: StepContext, cfg: SurrogateConfig) -> LossOutputs:
    """The configured loss on one micro-batch, with the entropy bonus and the reference KL every loss can
    carry (`regularizers.regularize`), plus the ratio's statistics every loss reports."""
    out = loss_spec(getattr(cfg, "name", None)).loss(x, ctx, cfg)
    mask = x.mask if out.mask is None else out.mask
    loss = regularize(out.loss, x, ctx, cfg, mask, out.metrics)
    out.metrics.update(
        ratio_stats(x.logprobs, x.old_logprobs, x.advantages, x.mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high)
    )
    return LossOutputs(loss, out.metrics, out.mask)
