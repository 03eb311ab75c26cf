"""The in-memory RunState: the embedded `stare train` (API thread + training loop) and unit tests.

Same semantics as the Redis store (see base.py), guarded by one lock so the API thread and the
training loop can share it. Lost when the process ends; that is the embedded mode's lifetime.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from stare.runstate.base import (
    DEFAULT_FORGET_AFTER_S,
    DEFAULT_MAX_AUDIT,
    DEFAULT_MAX_METRICS,
    AuditEntry,
    CommandEntry,
    Heartbeat,
    MetricsPage,
    RoleHealth,
    RunCommand,
    forgotten,
    json_safe,
    merged_config,
    page_bounds,
    plan_change,
    published_max_entropy,
    rejected_entry,
    role_health,
)


class MemoryRunState:
    def __init__(
        self,
        run_id: str,
        *,
        dead_after_s: float = 15.0,
        max_metrics: int = DEFAULT_MAX_METRICS,
        max_audit: int = DEFAULT_MAX_AUDIT,
        forget_after_s: float = DEFAULT_FORGET_AFTER_S,
    ):
        self.run_id, self.dead_after_s, self.forget_after_s = run_id, dead_after_s, forget_after_s
        self._names: dict[str, tuple[str, float]] = {}  # claim_name: "role/name" -> (holder, expiry)
        self._lock = threading.Lock()
        self._heartbeats: dict[str, Heartbeat] = {}
        self._status: dict[str, Any] | None = None
        self._metrics: deque[dict[str, Any]] = deque(maxlen=max_metrics)
        self._metrics_total = 0
        self._controller: dict[str, Any] | None = None
        self._pending: list[AuditEntry] = []
        self._audit: deque[AuditEntry] = deque(maxlen=max_audit)
        self._applied: dict[int, tuple[int, str | None]] = {}
        self._audit_seq = 0
        self._commands: deque[CommandEntry] = deque(maxlen=max_audit)
        self._command_seq = 0
        self._paused = False
        self._checkpoint = False

    def ping(self) -> bool:
        return True

    def beat(self, heartbeat: Heartbeat) -> None:
        with self._lock:
            self._heartbeats[f"{heartbeat.role}/{heartbeat.name}"] = heartbeat.model_copy()

    def roles(self) -> list[RoleHealth]:
        now = time.time()
        listed = []
        with self._lock:
            for key in sorted(self._heartbeats):
                health = role_health(self._heartbeats[key], self.dead_after_s, now)
                if forgotten(health, self.forget_after_s):
                    del self._heartbeats[key]
                else:
                    listed.append(health)
        return listed

    def claim_name(self, role: str, name: str, holder: str, ttl_s: float) -> bool:
        """Reserve `role/name` for `holder` for `ttl_s` unless another holder reserved it (see RedisRunState)."""
        now, key = time.monotonic(), f"{role}/{name}"
        with self._lock:
            current = self._names.get(key)
            if current is not None and current[1] > now and current[0] != holder:
                return False
            self._names[key] = (holder, now + ttl_s)
            return True

    def set_status(self, status: dict[str, Any]) -> None:
        with self._lock:
            self._status = json_safe(status)

    def status(self) -> dict[str, Any] | None:
        with self._lock:
            return None if self._status is None else dict(self._status)

    def append_metrics(self, metrics: dict[str, Any]) -> int:
        with self._lock:
            self._metrics.append(json_safe(metrics))
            self._metrics_total += 1
            return self._metrics_total - 1

    def metrics_page(self, offset: int = 0, limit: int = 100) -> MetricsPage:
        with self._lock:
            total, kept = self._metrics_total, list(self._metrics)
        first = total - len(kept)
        start, stop = page_bounds(first, total, offset, limit)
        return MetricsPage(items=kept[start - first : stop - first], offset=start, next=stop, first=first, total=total)

    def publish_controller(self, state: dict[str, Any]) -> None:
        with self._lock:
            self._controller = json_safe(state)

    def controller(self) -> dict[str, Any] | None:
        with self._lock:
            return None if self._controller is None else dict(self._controller)

    def request_entropy_change(self, changes: dict[str, Any], who: str) -> AuditEntry:
        with self._lock:
            current = merged_config(self._controller, self._pending)
            entry = plan_change(
                self._audit_seq + 1, current, changes, who, time.time(), published_max_entropy(self._controller)
            )
            self._audit_seq += 1
            self._pending.append(entry)
            self._audit.append(entry)
            return entry.model_copy()

    def pending_entropy_changes(self) -> list[AuditEntry]:
        with self._lock:
            return [e.model_copy() for e in self._pending]

    def take_entropy_changes(self) -> list[AuditEntry]:
        with self._lock:
            taken, self._pending = self._pending, []
            return taken

    def record_applied(self, ids: list[int], step: int, error: str | None = None) -> None:
        with self._lock:
            for i in ids:
                self._applied[i] = (step, error)

    def record_rejected(self, entry: AuditEntry, step: int, reason: str) -> None:
        with self._lock:
            copy = rejected_entry(entry, list(self._audit), self._audit_seq + 1)
            if copy is not None:
                self._audit_seq += 1
                self._audit.append(copy)
            self._applied[entry.id if copy is None else copy.id] = (step, reason)

    def audit(self, limit: int = 100) -> list[AuditEntry]:
        with self._lock:
            entries = list(self._audit)[-limit:] if limit > 0 else []
            applied = dict(self._applied)
        out = []
        for e in entries:
            step, error = applied.get(e.id, (None, None))
            out.append(e.model_copy(update={"applied_step": step, "error": error}))
        return out

    def set_paused(self, paused: bool) -> None:
        with self._lock:
            self._paused = paused

    def paused(self) -> bool:
        with self._lock:
            return self._paused

    def request_checkpoint(self) -> None:
        with self._lock:
            self._checkpoint = True

    def checkpoint_requested(self) -> bool:
        with self._lock:
            return self._checkpoint

    def take_checkpoint_request(self) -> bool:
        with self._lock:
            taken, self._checkpoint = self._checkpoint, False
            return taken

    def record_command(self, command: RunCommand, who: str) -> CommandEntry:
        with self._lock:
            self._command_seq += 1
            entry = CommandEntry(id=self._command_seq, who=who, when=time.time(), command=command)
            self._commands.append(entry)
            return entry.model_copy()

    def commands(self, limit: int = 100) -> list[CommandEntry]:
        with self._lock:
            return [e.model_copy() for e in list(self._commands)[-limit:]] if limit > 0 else []
