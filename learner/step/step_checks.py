"""Checks around a learner step: a step whose loss or gradient is not finite (counted, not silent), and
packed sequences on a transformers build that keeps them apart."""

from __future__ import annotations

import logging
import math

log = logging.getLogger(__name__)


def nonfinite_step(loss: float, grad_norm: float | None, step: int) -> int:
    """1 (and a warning) when the step's loss or gradient norm is NaN or infinite, else 0. DeepSpeed
    skips such an update ("OVERFLOW! Skipping step"); counting them makes a run that stopped learning
    visible in status, metrics and Prometheus instead of only in the engine's log."""
    if math.isfinite(loss) and (grad_norm is None or math.isfinite(grad_norm)):
        return 0
    log.warning(
        "step %d: loss %s, grad_norm %s: not finite (the optimizer update was skipped or is invalid)",
        step,
        loss,
        grad_norm,
    )
    return 1


def check_packing_supported(model) -> None:
    """Packed rows need attention that separates sequences by their position_ids: transformers'
    mask builder does so from 4.54 (sdpa, eager, flex) and flash-attention's varlen path always;
    an older one would let packed sequences attend to each other, silently."""
    try:
        from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
    except ImportError:
        if getattr(model.config, "_attn_implementation", None) != "flash_attention_2":
            raise ValueError(
                "optim.pack_sequences needs transformers >= 4.54 (or flash_attention_2) to keep packed sequences "
                "apart; set optim.pack_sequences=false (padded token-budget micro-batches) or upgrade transformers"
            ) from None
