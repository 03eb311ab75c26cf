"""The reward's configuration (core: the run config's `reward:` section): the verifiers' settings
and their weighted composition. The verifiers themselves are in the reward role
(reward.verifiers.format, .overlong, .code, stare.data.tasks.math_verify; `reward.verifiers.compose.compute_reward`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stare.sandbox import SandboxConfig

_TAG_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


AnswerSource = Literal["boxed", "answer_tag", "answer_line", "anywhere"]


class MathConfig(BaseModel):
    """How the math verifier extracts and compares answers."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    extract_from: tuple[AnswerSource, ...] = Field(("boxed", "answer_tag", "answer_line"), min_length=1)
    """Where the final answer may be, tried in order; "anywhere" lets math-verify search the
    whole response (lenient: it may pick an intermediate number)."""
    timeout_s: float = Field(5.0, gt=0, le=300)
    """Seconds for one check (extraction, parsing and comparison together)."""
    max_answer_chars: int = Field(1000, ge=1, le=100_000)
    """Longer extracted answers are judged wrong without parsing (sympy cost grows fast)."""
    float_rounding: int = Field(6, ge=0, le=15)
    """Decimal places math-verify rounds floats to before comparing."""
    strict: bool = True
    """math-verify strict mode: variable names matter; sets are not tuples."""


class FormatConfig(BaseModel):
    """Which tags the response must contain, and how strictly."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    required_tags: tuple[str, ...] = Field(("think", "answer"), min_length=1)
    """Tag names, without angle brackets, in the order they must appear."""
    exactly_once: bool = True
    """Each tag opens and closes exactly once (off: at least once; the first pair counts)."""
    in_order: bool = True
    """The tags appear in the order of required_tags and do not overlap."""
    nothing_after: bool = False
    """Only whitespace may follow the last closing tag."""
    prefix: str = ""
    """Text the prompt already ends with (e.g. "<think>"), prepended before checking."""
    partial_credit: bool = False
    """Score the fraction of checks passed instead of all-or-nothing."""

    @field_validator("required_tags")
    @classmethod
    def _names(cls, tags: tuple[str, ...]) -> tuple[str, ...]:
        for tag in tags:
            if not _TAG_NAME.match(tag):
                raise ValueError(f"required_tags: {tag!r} is not a bare tag name like 'answer'")
        if len(set(tags)) != len(tags):
            raise ValueError(f"required_tags: {tags} lists a tag twice")
        return tags


class OverlongConfig(BaseModel):
    """L_max, L_cache and the penalty scale of the DAPO soft overlong punishment."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_length: int = Field(20480, ge=1)
    """L_max: response tokens at which the penalty reaches -penalty_factor."""
    cache_length: int = Field(4096, ge=0)
    """L_cache: the penalty ramps over the last cache_length tokens before max_length."""
    penalty_factor: float = Field(1.0, ge=0.0, le=100.0)
    """Scale of the penalty (the paper uses 1)."""

    @model_validator(mode="after")
    def _cache_fits(self) -> OverlongConfig:
        if self.cache_length > self.max_length:
            raise ValueError(
                f"cache_length ({self.cache_length}) must be <= max_length ({self.max_length}); lower cache_length"
            )
        return self


class CodeConfig(BaseModel):
    """How programs are extracted, run and scored."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    mode: Literal["fraction", "all"] = "fraction"
    """"fraction": passed / total; "all": 1.0 only if every test passes."""
    extract_code: bool = True
    """Take the last ```python fenced block of the response (off: the response is the code)."""
    sandbox: SandboxConfig = SandboxConfig()
    """Isolation and limits of each test run."""


class _Component(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str | None = None
    """Key in RewardResult.components; default: the kind."""
    weight: float = Field(1.0, ge=-100.0, le=100.0)
    """Multiplier of the component's score in the reward."""

    @property
    def key(self) -> str:
        return self.name or self.kind  # type: ignore[attr-defined]


class MathComponent(_Component):
    """1.0 if the final answer is equivalent to `RewardInput.answer`, else 0.0."""

    kind: Literal["math"] = "math"
    config: MathConfig = MathConfig()


class CodeComponent(_Component):
    """Fraction (or all) of `RewardInput.tests` the program passes."""

    kind: Literal["code"] = "code"
    config: CodeConfig = CodeConfig()


class FormatComponent(_Component):
    """1.0 if the required tags are present and well formed (see format.FormatConfig)."""

    kind: Literal["format"] = "format"
    config: FormatConfig = FormatConfig()


class OverlongComponent(_Component):
    """DAPO soft overlong penalty in [-1, 0] on `RewardInput.response_tokens`."""

    kind: Literal["overlong"] = "overlong"
    config: OverlongConfig = OverlongConfig()


class TaskComponent(_Component):
    """The task's own verifier (`task.reward`: the arithmetic tasks' exact match, the dataset task's
    math-verify check), so shaping components can be added to it."""

    kind: Literal["task"] = "task"


class FunctionComponent(_Component):
    """A reward function of the user's own (reward.verifiers.function): verl's `compute_score` signature or
    TRL's `reward_funcs` one, imported from a file or module, run in the scoring processes."""

    kind: Literal["function"] = "function"
    path: str = Field(min_length=1)
    """A .py file (a relative path starts at the working directory of each process that scores) or an
    importable module name (verl: custom_reward_function.path)."""
    function: str = Field("compute_score", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The function's name in it (verl: custom_reward_function.name)."""
    signature: Literal["verl", "trl"] = "verl"
    """verl: f(data_source, solution_str, ground_truth, extra_info) -> float or {"score": float, "acc": bool,
    ...}, per response. trl: f(prompts, completions, **kwargs) -> list[float] (GRPOTrainer's reward_funcs),
    called per response with lists of one."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments of every call (verl: custom_reward_function.reward_kwargs)."""
    completions: Literal["text", "messages"] = "text"
    """trl only: each completion as its text, or as [{"role": "assistant", "content": text}] (TRL's form for
    conversational data)."""

    @property
    def key(self) -> str:
        return self.name or self.function


RewardComponent = Annotated[
    MathComponent | CodeComponent | FormatComponent | OverlongComponent | TaskComponent | FunctionComponent,
    Field(discriminator="kind"),
]

CORRECTNESS_KINDS = ("math", "task", "function")
"""Components that judge an answer right or wrong: the first of them in `components` decides a response's
correctness (accuracy, held-out pass@k); without one a reward of at least 1 is correct."""


class ScoringSection(BaseModel):
    """The scoring processes (reward.scoring_pool.ScoringPool): each response's components run in one of
    them, with a hard time limit and an address-space limit. `stare reward` always scores in them;
    `stare train` when a function component is present (else in process)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int = Field(2, ge=1, le=512)
    """Scoring processes (`stare train`'s; a `stare reward` worker's unless --workers is given)."""
    timeout_s: float = Field(30.0, gt=0, le=3600)
    """Seconds to score one response (every component): past it the process is killed and replaced, and
    the response scores 0 with the error 'timed out'."""
    memory_mb: int | None = Field(4096, ge=64, le=1 << 20)
    """Address-space limit of each scoring process (RLIMIT_AS): an allocation past it raises MemoryError,
    the response scores 0. None: no limit."""


class RewardConfig(BaseModel):
    """The reward of a task: weighted components and a time budget per component."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    components: tuple[RewardComponent, ...] = Field(min_length=1)
    timeout_s: float = Field(60.0, gt=0, le=3600)
    """Seconds per component (in-thread: Python code is interrupted, a long C call is not; the scoring
    processes' `scoring.timeout_s` is the hard bound)."""
    scoring: ScoringSection = ScoringSection()
    """The processes that score (time and memory limits per response)."""

    @property
    def functions(self) -> tuple[FunctionComponent, ...]:
        """The function components (user code: scored in the scoring processes in every mode)."""
        return tuple(c for c in self.components if isinstance(c, FunctionComponent))

    @property
    def needs_rows(self) -> bool:
        """Whether responses must carry their prompt's text and its row's extra_info (a function reads them)."""
        return bool(self.functions)

    @model_validator(mode="after")
    def _unique_names(self) -> RewardConfig:
        keys = [c.key for c in self.components]
        duplicates = sorted({k for k in keys if keys.count(k) > 1})
        if duplicates:
            raise ValueError(
                f"components: names {duplicates} repeat; give each component of the same kind its own `name`"
            )
        return self
