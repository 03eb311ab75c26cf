"""The reward verifiers' registry: one entry per component kind, `@register_verifier(kind)` on the
function that scores a response for it: (component config, RewardInput, VerifierContext) -> a score, or
a `Verdict` (the score and whether the answer is right, when the verifier says so apart from the score).

The config half of a kind (its `reward.components` entry) is stare.config.reward's, read by every
process; tests/reward/test_verifier_registry.py checks that the two name the same kinds. Add a
verifier: its module here with `@register_verifier`, its import in reward/verifiers/__init__.py, its
component class in stare/config/reward.py, a test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from stare.sandbox import Sandbox


class VerifierContext(NamedTuple):
    """What a verifier may use besides the sample: the sandbox for code (None: each code component builds
    its own) and the run's task (for the task's own verifier)."""

    sandbox: Sandbox | None = None
    task: Any = None


class Verdict(NamedTuple):
    """A score with the verifier's own correctness verdict (a verl dict's "acc"); None: score >= 1."""

    score: float
    correct: bool | None = None


Scorer = Callable[..., "float | Verdict"]

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
