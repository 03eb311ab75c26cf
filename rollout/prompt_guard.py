"""Prompts a rollout worker can sample: the length limit and what happens to a prompt over it.

The limit is the smaller of `data.max_prompt_len` and what the engine's `max_model_len` leaves
after `max_new_tokens`. Over it, `truncate_left` keeps the prompt's last `limit` tokens (the end
of a chat prompt holds the question and the generation prompt; the reference truncates left too)
and `reject` returns a reason, which the worker writes to the prompts dead-letter stream. An
empty prompt or a token id outside the vocabulary always has a reason. Nothing here raises, so a
bad prompt never takes its worker down.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

Overflow = Literal["truncate_left", "reject"]


def prompt_limit(max_prompt_len: int | None, max_model_len: int | None, max_new_tokens: int) -> int | None:
    """The longest prompt a worker samples (None: no limit known)."""
    limits = [
        n for n in (max_prompt_len, None if max_model_len is None else max_model_len - max_new_tokens) if n is not None
    ]
    return min(limits) if limits else None


def fit_prompt(
    ids: Sequence[int], limit: int | None, overflow: Overflow, vocab_size: int | None = None
) -> tuple[list[int] | None, str | None]:
    """(the ids to sample, None) or (None, why the prompt cannot be sampled)."""
    ids = list(ids)
    if not ids:
        return None, "empty prompt: it has no token"
    if vocab_size is not None and (min(ids) < 0 or max(ids) >= vocab_size):
        bad = min(ids) if min(ids) < 0 else max(ids)
        return None, f"prompt has token id {bad} outside the model's vocabulary [0, {vocab_size})"
    if limit is not None and limit < 1:
        return None, (
            f"no room for a prompt: the engine's max_model_len leaves {limit} tokens after "
            "rollout.max_new_tokens; lower rollout.max_new_tokens or raise max_model_len"
        )
    if limit is None or len(ids) <= limit:
        return ids, None
    if overflow == "truncate_left":
        return ids[-limit:], None
    return None, (
        f"prompt has {len(ids)} tokens, over the limit of {limit} (data.max_prompt_len, or the engine's "
        "max_model_len minus rollout.max_new_tokens); data.prompt_overflow=reject parks it here (admit it with "
        "data.prompt_overflow=truncate_left, or raise that limit)"
    )
