"""DAPO overlong reward shaping (Yu et al. 2025, "DAPO", eq. 13, "soft overlong punishment").

With L_max = `max_length` and L_cache = `cache_length`, a response of |y| tokens gets

    R_length(y) = 0                                  if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                = -1                                 if |y| > L_max

times `penalty_factor` (1.0 in the paper), added to the task reward: no penalty until the last
L_cache tokens before L_max, then linear down to -1 at L_max. In DAPO L_max = 20480 with
L_cache = 4096 (generation is capped at L_max, so the -1 branch is the truncated case).
`cache_length = 0` is the hard cut: 0 up to L_max, -1 beyond. Lengths count response tokens only.

Not covered: filtering truncated samples out of the loss ("overlong filtering", the other DAPO
option) is the learner's job, not a reward.
"""

from __future__ import annotations

from reward.verifiers.registry import need, register_verifier
from stare.config.reward import OverlongConfig


def overlong_penalty(length: int, config: OverlongConfig | None = None) -> float:
    """R_length for a response of `length` tokens: 0, a linear ramp, or -penalty_factor."""
    config = config or OverlongConfig()
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    expected = config.max_length - config.cache_length
    if length <= expected:
        return 0.0
    if length > config.max_length:
        return -config.penalty_factor
    return config.penalty_factor * (expected - length) / config.cache_length


@register_verifier("overlong")
def score_overlong(c, x, context) -> float:
    return overlong_penalty(need(x.response_tokens, "response_tokens", "overlong"), c.config)
