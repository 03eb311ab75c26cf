"""Bundled verifiable tasks. `build_task(name, **kwargs)` builds one from the `TASKS` registry."""

from stare.tasks.base import TASKS, Problem, Split, SupervisedTask, Task, build_task

__all__ = ["TASKS", "Problem", "Split", "SupervisedTask", "Task", "build_task"]
