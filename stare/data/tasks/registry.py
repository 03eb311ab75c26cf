"""The task registry: one `TaskSpec` per task (its factory, and its reward-side verifier where that
differs). Factories import their task lazily, so the registry costs nothing; `build_task(name,
**kwargs)` builds one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class TaskSpec:
    build: Callable[..., Task]  # **kwargs -> the task (imports its module lazily)
    # the task as a reward worker needs it (`reward` and `extract_answer` on the ground truth each
    # trajectory carries), for a task whose problems open files; None: `build` is cheap enough
    verifier: Callable[..., Task] | None = None


# One entry per task. Add a task: its module in stare/data/tasks/ (the `Task` protocol of base.py),
# its entry here, a test.
TASKS: dict[str, TaskSpec] = {
    "arithmetic": TaskSpec(_arithmetic),
    "tool-arithmetic": TaskSpec(_tool_arithmetic),
    "chat-arithmetic": TaskSpec(_chat_arithmetic),  # a real instruct model's chat template: tokenizer=tok
    "dataset": TaskSpec(_dataset, verifier=_dataset_verifier),  # a verl-format parquet/jsonl file: path=...
}


def _spec(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; valid names: {', '.join(sorted(TASKS))}") from None


def build_task(name: str, **kwargs: Any) -> Task:
    """Build the registered task `name` with its keyword arguments."""
    return _spec(name).build(**kwargs)


def build_verifier(name: str, **kwargs: Any) -> Task:
    """The task `name` as a reward worker needs it: `reward` and `extract_answer` on ground truth
    carried by the trajectory. Tasks that open files (dataset) build a verifier-only object that
    takes only the verifier's settings; the others build as `build_task(name)` (cheap, no files)."""
    spec = _spec(name)
    return (spec.verifier or spec.build)(**kwargs)
