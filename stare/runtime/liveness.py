"""Liveness of a process's main loop: `tick`, `busy`, `healthy`, and the heartbeat thread that reports
them through the run's `RunSteering` (Redis for the distributed roles, the in-memory state for `stare train`).

    live = Liveness(steering, heartbeat_s=2.0, stall_s=300.0)
    with live.running():                         # the heartbeat thread runs inside (or start() ... close())
        live.tick(step=3)                        # the main loop is alive
        with live.busy("training step"):         # long work: alive while this thread uses CPU (or ticks)
            ...

The heartbeat thread beats every `heartbeat_s` whatever the main thread does, so the role stays listed alive
(`alive` in /v1/status: the process is there); its `healthy` field says whether the loop is making progress:
it ticked within `stall_s`, or it is inside `busy` and its thread's CPU time grew since the last look (compute,
and CUDA synchronisation, which spins, count). A thread blocked on a dead peer's collective or socket uses no
CPU: `stall_s` later it reads unhealthy (the /healthz endpoint answers 503).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

MIN_PROGRESS_CPU_S = 0.01
"""CPU seconds a busy thread must use between two looks to count as making progress (a blocked
thread uses none; a heartbeat interval of real work uses far more)."""


def thread_cpu_s(ident: int) -> float | None:
    """CPU seconds thread `ident` (threading.get_ident()) has used; None where the OS has no
    per-thread CPU clock (then only explicit ticks keep a busy loop healthy)."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident))
    except (AttributeError, OSError):
        return None


class Liveness:
    def __init__(self, steering: Any, *, heartbeat_s: float, stall_s: float, stop: threading.Event | None = None):
        self.steering, self.heartbeat_s, self.stall_s = steering, heartbeat_s, stall_s
        self.stop = stop or threading.Event()
        self.info: dict[str, Any] = {}
        self.last_tick = time.monotonic()
        self._busy: tuple[str, int, float | None] | None = None  # (what, thread id, its CPU time when last seen)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def tick(self, **info: Any) -> None:
        """The main loop is alive; `info` goes into the next heartbeat."""
        self.last_tick = time.monotonic()
        self.info.update(info)

    def healthy(self) -> bool:
        self._watch_busy()
        return time.monotonic() - self.last_tick < self.stall_s

    @contextlib.contextmanager
    def busy(self, what: str) -> Iterator[None]:
        """Long work on the calling thread: healthy while this thread uses CPU (or ticks); a hung one
        reads unhealthy after `stall_s`. Nests (the outermost is watched)."""
        if self._busy is not None:
            yield
            return
        self.tick(busy=what)
        ident = threading.get_ident()
        with self._lock:
            self._busy = (what, ident, thread_cpu_s(ident))
        try:
            yield
        finally:
            with self._lock:
                self._busy = None
            self.info.pop("busy", None)
            self.tick()

    def _watch_busy(self) -> None:
        """A busy thread whose CPU time grew since it was last seen is making progress: tick."""
        with self._lock:
            if self._busy is None:
                return
            what, ident, seen = self._busy
            now = thread_cpu_s(ident)
            if now is not None and seen is not None and now - seen >= MIN_PROGRESS_CPU_S:
                self._busy = (what, ident, now)
                self.last_tick = time.monotonic()

    # ------------------------------------------------------------------ the heartbeat thread
    def start(self) -> Liveness:
        self._thread = threading.Thread(target=self._beat_loop, name="heartbeat", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout_s: float = 5.0) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The heartbeat thread for the length of the block (its own stop event, set on leaving)."""
        self.stop = threading.Event()
        self.start()
        try:
            yield
        finally:
            self.close()

    def _beat_loop(self) -> None:
        while True:
            try:
                self.steering.heartbeat(info={**self.info, "healthy": self.healthy()}, force=True)
            except Exception as err:  # Redis restarting: the next beat retries
                log.warning("heartbeat failed: %s", err)
            if self.stop.wait(self.heartbeat_s):
                return
