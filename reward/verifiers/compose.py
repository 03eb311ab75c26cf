"""Compose verifiers into one scalar reward: a weighted sum of named components.

`RewardConfig.components` is a list of discriminated components (`kind`: "math", "code",
"format", "overlong", "task", "function"), each with a `weight` and its verifier's config;
`compute_reward(sample, config)` returns `RewardResult(reward, components, error, correct)` where
`components` maps each component's name (its `name`, default its kind; a function's: its function
name) to its unweighted score and `reward` is sum(weight * score). `correct` is the verdict of the
first component that judges answers (math, task, function: stare.config.reward.CORRECTNESS_KINDS).

Fault tolerance is the point here: if any verifier raises, times out (`timeout_s` per component,
`timeouts.call_with_timeout`) or its sandbox fails, the whole reward is 0.0 and `error` says
which component failed and why; no exception escapes `compute_reward`. A wrong answer is not an
error: it scores 0 in its component and the others still count.

Not covered: the timeout is in-thread (see `timeouts`); run `compute_reward` inside
`ScoringPool` for a hard bound and crash isolation.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from reward.verifiers.code import CodeTests
from reward.verifiers.registry import VERIFIERS, Verdict, VerifierContext
from stare.config.reward import (  # the config half lives in the core (the run config's reward: section)
    CORRECTNESS_KINDS,
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
    correct: bool | None = None
    """The judging component's verdict (see the module docstring); None: none judged (then a reward of
    at least 1 counts as correct)."""


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
    # what a task's own verifier and a user's function read (verl's and TRL's arguments)
    data_source: str = ""
    problem_id: str = ""
    level: int = 1
    extra_info: dict[str, Any] = Field(default_factory=dict)
    """The dataset row's extra_info ({} without one)."""
    prompt: str = ""
    """The prompt as the model saw it ("" unless the reward has a function component)."""
    response_token_ids: tuple[int, ...] = ()
    step: int = 0
    """The weight version that sampled the response (TRL's trainer_state.global_step)."""


def compute_reward(
    sample: RewardInput, config: RewardConfig, sandbox: Sandbox | None = None, task: Any = None
) -> RewardResult:
    """Score `sample` with every component of `config`; never raises (see the module docstring).

    `sandbox` runs code components (None: a `ProcessSandbox` from each code component's config); `task`
    is the run's task, for a `task` component.
    """
    context = VerifierContext(sandbox=sandbox, task=task)
    scores: dict[str, float] = {}
    correct: bool | None = None
    judged = False
    for component in config.components:
        scorer = VERIFIERS[component.kind]
        try:
            out = call_with_timeout(scorer, config.timeout_s, component, sample, context)
        except VerifierTimeout as exc:
            return RewardResult(reward=0.0, components=scores, error=f"{component.key}: {exc}")
        except Exception as exc:
            return RewardResult(reward=0.0, components=scores, error=f"{component.key}: {type(exc).__name__}: {exc}")
        score, verdict = (out.score, out.correct) if isinstance(out, Verdict) else (float(out), None)
        scores[component.key] = score
        if component.kind in CORRECTNESS_KINDS and not judged:
            judged, correct = True, (score >= 1.0 if verdict is None else verdict)
    reward = sum(c.weight * scores[c.key] for c in config.components)
    return RewardResult(reward=reward, components=scores, correct=correct)
