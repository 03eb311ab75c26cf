"""The policy losses: STARE and the baselines, pure functions over one micro-batch, one module each,
registered in `registry.py` (`@register_loss`). Importing this package registers every loss below.

Add a loss: its module here (the function with `@register_loss`, and its step-global `select` if it
picks tokens over the step), its import below, its config class in stare/config/algo.py, a test.
"""

from learner.algorithm.losses import covariance, entropy_bonus, grpo, high_entropy, stare  # noqa: F401  (registers)
from learner.algorithm.losses.base import LossInputs, LossOutputs, StepContext, StepTokens
from learner.algorithm.losses.registry import LOSSES, LossSpec, loss_spec, policy_loss, register_loss

__all__ = [
    "LOSSES",
    "LossInputs",
    "LossOutputs",
    "LossSpec",
    "StepContext",
    "StepTokens",
    "loss_spec",
    "policy_loss",
    "register_loss",
]
