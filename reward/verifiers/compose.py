"""Compose verifiers into one scalar reward: a weighted sum of named components.

`RewardConfig.components` is a list of discriminated components (`kind`: "math", "code",
"format", "overlong"), each with a `weight` and its verifier's config; `compute_reward(sample,
config)` returns `RewardResult(reward, components, error)` where `components` maps each
component's name (its `name`, default its kind) to its unweighted score and `reward` is
sum(weight * score).

Fault tolerance is the point here: if any verifier raises, times out (`timeout_s` per component,
`timeouts.call_with_timeout`) or its sandbox fails, the whole reward is 0.0 and `error` says
which component failed and why; no exception escapes `compute_reward`. A wrong answer is not an
error: it scores 0 in its component and the others still count.

Not covered: the timeout is in-thread (see `timeouts`); run `compute_reward` inside
`ScoringPool` for a hard bound and crash isolation.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from reward.verifiers.code import CodeTests
from reward.verifiers.registry import VERIFIERS
from stare.config.reward import (  # the config half lives in the core (the run config's reward: section)
    CodeComponent,
    FormatComponent,
    MathComponent,
    OverlongComponent,
    RewardComponent,
    RewardConfig,
)
from stare.runtime.timeouts import VerifierTimeout, call_with_timeout
from stare.sandbox import Sandbox

__all__ = [
    "CodeComponent",
    "FormatComponent",
    "MathComponent",
    "OverlongComponent",
    "RewardComponent",
    "RewardConfig",
    "RewardInput",
    "RewardResult",
    "compute_reward",
]


class RewardResult(BaseModel):
    """The reward of one response, each component's unweighted score, and the failure if any
    (then `reward` is 0.0)."""

    model_config = ConfigDict(frozen=True)

    reward: float
    components: dict[str, float] = Field(default_factory=dict)
    error: str | None = None


class RewardInput(BaseModel):
    """What the verifiers judge: the response and whatever reference its task carries."""

    model_config = ConfigDict(frozen=True)

    response: str
    response_tokens: int | None = Field(None, ge=0)
    """Length in tokens (the overlong component needs it)."""
    answer: str | None = None
    """Reference answer (the math component needs it)."""
    tests: CodeTests | None = None
    """Tests (the code component needs them)."""


def compute_reward(sample: RewardInput, config: RewardConfig, sandbox: Sandbox | None = None) -> RewardResult:
    """Score `sample` with every component of `config`; never raises (see the module docstring).

    `sandbox` runs code components; None builds a `ProcessSandbox` from each code component's
    config.
    """
    scores: dict[str, float] = {}
    for component in config.components:
        scorer = VERIFIERS[component.kind]
        try:
            scores[component.key] = float(call_with_timeout(scorer, config.timeout_s, component, sample, sandbox))
        except VerifierTimeout as exc:
            return RewardResult(reward=0.0, components=scores, error=f"{component.key}: {exc}")
        except Exception as exc:
            return RewardResult(reward=0.0, components=scores, error=f"{component.key}: {type(exc).__name__}: {exc}")
    reward = sum(c.weight * scores[c.key] for c in config.components)
    return RewardResult(reward=reward, components=scores)
