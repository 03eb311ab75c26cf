"""The seam between `stare up` and where the roles run: a `Launcher` starts the roles of one run,
supervises them until the learner finishes, and stops them. One protocol, one implementation per
target:

    ProcessLauncher   processes on this machine (processes.py; the node-colocated learner too)
    ComposeLauncher   Docker Compose services on this machine (compose.py)
    RayLauncher       Ray actors on a cluster (ray.py)

`run_until_done(launcher)` (run.py) is the foreground every target shares: start, supervise,
stop, with Ctrl-C / SIGTERM handled once. A new target (another scheduler) is one module with a
class of this shape and a `--target` choice in `stare up`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from stare.config import TrainConfig


class Launcher(Protocol):
    cfg: TrainConfig  # the run's config as the roles get it (ports and model directory resolved)
    force_stop: bool  # a second Ctrl-C: stop() kills what is left instead of waiting

    def say(self, text: str, who: str = ...) -> None:
        """One line of the launcher's own output."""

    def start(self) -> None:
        """Start every role (and Redis, unless the run was given one)."""

    def supervise(self, until: Callable[[], bool] = ..., poll_s: float = ...) -> int:
        """Wait for the run: restart (or let the target restart) roles that die, until the learner
        finishes (its exit code), `until()` holds (0), or a role gives up (non-zero)."""

    def kill(self, name: str) -> object:
        """Kill one role at once (tests and chaos runs: a role dying mid-run)."""

    def stop(self) -> None:
        """Stop every role (workers first, the learner checkpoints), then what start() started."""
