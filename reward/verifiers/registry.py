"""The reward verifiers' registry: one entry per component kind, `@register_verifier(kind)` on the
function that scores a response for it: (component config, RewardInput, sandbox or None) -> score.

The config half of a kind (its `reward.components` entry) is stare.config.reward's, read by every
process; tests/reward/test_verifier_registry.py checks that the two name the same kinds. Add a
verifier: its module here with `@register_verifier`, its import in reward/verifiers/__init__.py, its
component class in stare/config/reward.py, a test.
"""

from __future__ import annotations

from collections.abc import Callable

Scorer = Callable[..., float]

VERIFIERS: dict[str, Scorer] = {}


def register_verifier(kind: str) -> Callable[[Scorer], Scorer]:
    def add(fn: Scorer) -> Scorer:
        if kind in VERIFIERS:
            raise ValueError(f"verifier {kind!r} is registered twice")
        VERIFIERS[kind] = fn
        return fn

    return add


def need(value, field: str, kind: str):
    """A reference the component needs from the sample (the answer, the tests, the length)."""
    if value is None:
        raise ValueError(f"RewardInput.{field} is missing; the {kind} component needs it")
    return value
