"""Verifiable tasks: the `Problem` record, the `Task` protocol and the task registry.

A task hands out prompts with known answers and scores completions against them. Rewards are
outcome-only (1.0 for a correct final answer, else 0.0) and never raise, whatever the policy
writes. Tasks are deterministic from a seed so runs and tests are reproducible.

Not covered here: partial credit, format rewards or length shaping (those live in `reward`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Split = Literal["train", "test"]


def chat_prompt(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> str:
    """`messages` through the tokenizer's chat template, with the generation prompt, as text."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(text, str):  # tokenize=False gives text; transformers types every form it can return
        raise TypeError(f"the tokenizer's chat template gave a {type(text).__name__}, not text")
    return text


def check_split(split: str, n: int) -> None:
    """The arguments of `Task.problems`, checked the same way by every task."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer.

    Invariants: `answer` is the canonical string of the final answer (what `extract_answer` returns
    for a correct completion); `problem_id` is stable across processes and runs (it is derived from
    the problem's content, so the same problem drawn twice has the same id); `level` >= 1.
    """

    prompt: str
    answer: str
    problem_id: str
    level: int
    data_source: str
    prompt_token_ids: tuple[int, ...] | None = None
    """The prompt's tokens when a length policy already tokenized (and maybe cut) it
    (stare.data.prompt_policy); None: encode `prompt`."""
    extra_info: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """The dataset row's `extra_info` (JSON values; {} for generated tasks): what a reward function of the
    user's own reads (verl's compute_score(..., extra_info))."""


@runtime_checkable
class Task(Protocol):
    """A source of verifiable problems and their outcome reward."""

    name: str

    def problems(self, split: Split, n: int, seed: int) -> list[Problem]:
        """`n` problems of `split`, the same list for the same (split, n, seed); the train and test
        splits share no prompt."""
        ...

    def extract_answer(self, completion: str) -> str | None:
        """The final answer written in `completion`, canonicalised, or None if there is none."""
        ...

    def reward(self, problem: Problem, completion: str) -> float:
        """1.0 if the completion's final answer equals `problem.answer`, else 0.0; never raises."""
        ...


@runtime_checkable
class SupervisedTask(Task, Protocol):
    """A task that can also write a reference solution (used to warm-start the tiny model)."""

    def solution(self, problem: Problem, rng: random.Random | None = None) -> str:
        """A correct completion for `problem` (without any end-of-sequence token): the canonical
        one, or with `rng` a randomly drawn one of several equally correct ones."""
        ...
