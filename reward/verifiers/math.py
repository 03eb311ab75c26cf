"""The math component: answer equivalence with math-verify (the verifier itself is the core's,
stare.data.tasks.math_verify, which the math tasks use too)."""

from __future__ import annotations

from reward.verifiers.registry import need, register_verifier
from stare.data.tasks.math_verify import check_math


@register_verifier("math")
def score_math(c, x, context) -> float:
    return 1.0 if check_math(x.response, need(x.answer, "answer", "math"), c.config).correct else 0.0
