"""Bundled verifiable tasks. `build_task(name, **kwargs)` builds one from the `TASKS` registry."""

from stare.data.tasks.base import Problem, Split, SupervisedTask, Task
from stare.data.tasks.registry import TASKS, build_task

__all__ = ["TASKS", "Problem", "Split", "SupervisedTask", "Task", "build_task"]
