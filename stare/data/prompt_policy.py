"""The prompt length policy (`data.max_prompt_len`, `data.prompt_overflow`), applied when problems load.

A prompt longer than `max_prompt_len` tokens is either cut on the left (its last `max_prompt_len`
tokens kept: verl's `truncation='left'`, what the reference run uses) or rejected (the problem is
dropped). Either way the count and the longest prompt are logged, naming the config field, and
the kept problems carry their token ids (`Problem.prompt_token_ids`), so rollout never sees a
prompt over the cap and never re-tokenizes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from stare.data.tasks.base import Problem

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Overflow = Literal["truncate_left", "reject"]


class PromptPolicyError(ValueError):
    """Every problem was rejected: the message names the field to change."""


def prompt_ids(problem: Problem, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The problem's prompt tokens: the policy's when it set them, else the tokenizer's."""
    if problem.prompt_token_ids is not None:
        return list(problem.prompt_token_ids)
    ids: list[int] = tokenizer.encode(problem.prompt, add_special_tokens=False)
    return ids


def fit_prompts(
    problems: list[Problem],
    tokenizer: PreTrainedTokenizerBase,
    max_len: int | None,
    overflow: Overflow,
    *,
    what: str,
    log: Callable[[str], None] = print,
    limit_name: str = "data.max_prompt_len",
) -> list[Problem]:
    """`problems` with their prompt tokens set and cut (or dropped) to `max_len`; None: unchanged."""
    if max_len is None or not problems:
        return problems
    if overflow not in ("truncate_left", "reject"):
        raise ValueError(f"data.prompt_overflow must be truncate_left or reject, got {overflow!r}")
    encoded = tokenizer([p.prompt for p in problems], add_special_tokens=False)["input_ids"]
    out: list[Problem] = []
    over: list[tuple[str, int]] = []
    for problem, ids in zip(problems, encoded):
        if len(ids) > max_len:
            over.append((problem.problem_id, len(ids)))
            if overflow == "reject":
                continue
            ids = ids[-max_len:]
        out.append(dataclasses.replace(problem, prompt_token_ids=tuple(ids)))
    if over:
        longest = max(n for _, n in over)
        action = "truncated on the left (kept the last tokens)" if overflow == "truncate_left" else "rejected (dropped)"
        sample = ", ".join(pid for pid, _ in over[:3]) + (", ..." if len(over) > 3 else "")
        log(
            f"{what}: {len(over)} of {len(problems)} prompts are longer than {limit_name}={max_len} tokens "
            f"(longest {longest}): {action} by data.prompt_overflow={overflow} ({sample})"
        )
    if not out:
        raise PromptPolicyError(
            f"{what}: every prompt is longer than {limit_name}={max_len} tokens and "
            f"data.prompt_overflow=reject dropped them all; raise {limit_name.split(' minus')[0]} or set "
            f"data.prompt_overflow=truncate_left"
        )
    return out
