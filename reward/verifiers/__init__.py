"""Reward verifiers: a response -> a score. Code against tests in the sandbox (`code.py`), format
(`format.py`), DAPO's overlong shaping (`overlong.py`); math answer equivalence is the core's
(`stare.data.tasks.math_verify`, the tasks use it too; `math.py` registers it). `compose.py` weighs them into one reward. One
registry (`registry.py`): `@register_verifier(kind)` on each scoring function."""

from reward.verifiers import code, format, function, math, overlong, task  # noqa: F401  (each registers its verifier)
from reward.verifiers.registry import VERIFIERS, register_verifier

__all__ = ["VERIFIERS", "register_verifier"]
