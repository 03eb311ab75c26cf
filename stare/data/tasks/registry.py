"""The task registry: name -> factory. Factories import their task lazily, so the registry costs
nothing; `build_task(name, **kwargs)` builds one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stare.data.tasks.base import Task


def _arithmetic(**kwargs: Any) -> Task:
    from stare.data.tasks.arithmetic import ArithmeticTask

    return ArithmeticTask(**kwargs)


def _tool_arithmetic(**kwargs: Any) -> Task:
    from stare.data.tasks.tool_arithmetic import ToolArithmeticTask

    return ToolArithmeticTask(**kwargs)


def _chat_arithmetic(**kwargs: Any) -> Task:
    from stare.data.tasks.chat_arithmetic import ChatArithmeticTask

    return ChatArithmeticTask(**kwargs)


def _dataset(**kwargs: Any) -> Task:
    from stare.data.tasks.dataset import DatasetTask

    return DatasetTask(**kwargs)


def _dataset_verifier(**kwargs: Any) -> Task:
    from stare.data.tasks.dataset import DatasetVerifier

    return DatasetVerifier(**kwargs)


# name -> factory(**kwargs) -> Task. Factories import lazily so the registry costs nothing.
TASKS: dict[str, Callable[..., Task]] = {
    "arithmetic": _arithmetic,
    "tool-arithmetic": _tool_arithmetic,
    "chat-arithmetic": _chat_arithmetic,  # a real instruct model's chat template: build_task(..., tokenizer=tok)
    "dataset": _dataset,  # a verl-format parquet/jsonl file: build_task("dataset", path=...)
}


def build_task(name: str, **kwargs: Any) -> Task:
    """Build the registered task `name` with its keyword arguments."""
    try:
        factory = TASKS[name]
    except KeyError:
        raise ValueError(
            f"unknown task {name!r}; valid names: {', '.join(sorted(TASKS))}"
        ) from None
    return factory(**kwargs)


# name -> factory(**kwargs) of the task's verifier alone, for tasks whose problems need files:
# a reward worker scores from the ground truth each trajectory carries and opens no file.
VERIFIERS: dict[str, Callable[..., Task]] = {"dataset": _dataset_verifier}


def build_verifier(name: str, **kwargs: Any) -> Task:
    """The task `name` as a reward worker needs it: `reward` and `extract_answer` on ground truth
    carried by the trajectory. Tasks that open files (dataset) build a verifier-only object that
    takes only the verifier's settings; the others build as `build_task(name)` (cheap, no files)."""
    if name in VERIFIERS:
        return VERIFIERS[name](**kwargs)
    return build_task(name, **kwargs)
