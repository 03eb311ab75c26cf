"""`RunSteering`: the learner's side of the control plane, the only thing a training loop calls.

    control = RunSteering(state, role="learner", name="learner-0")
    control.start(controller)                      # publish the controller, phase "training"
    while training:
        d = control.before_step(controller)        # applies pending entropy changes
        if d.checkpoint: save()
        if d.paused: wait (heartbeat, before_step again) until not paused or stopping; continue
        metrics = train_step()
        control.after_step(controller, metrics, status)  # adds control_changes / control_audit_ids
    control.set_phase("finished")                  # or "failed"

`before_step` takes every pending change, merges them in request order and applies them with
`controller.reconfigure(**changes)`, which validates them again (bounds, strict types, ln V): a
change that no longer validates (the adaptive schedule moved W meanwhile) or never did (written to
the store directly, bypassing the API, e.g. `{"w": Infinity}`) is rejected, recorded in the audit
log with the reason (`record_rejected`) and skipped, never raised into the loop. The changes it
applied are reported in the next `after_step`'s metrics (`control_changes`: how many,
`control_audit_ids`: which), so the step that first ran with a new target says so.
`heartbeat()` rate-limits itself to `heartbeat_s`. Host-side only; call at step boundaries.

A learner resumed from a checkpoint at step S passes `start(..., resumed=True)`: the changes the
audit log says were applied at a step after S (the checkpoint does not hold them: the learner died
before its next checkpoint) are applied again, each before the step that first ran with it, so the
retrained steps run with the config they ran with the first time and no applied change is lost.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from stare.runstate.base import DEFAULT_MAX_AUDIT, AuditEntry, Heartbeat, RunState

log = logging.getLogger(__name__)


@dataclass
class StepDirectives:
    paused: bool = False  # wait before the next step (call before_step again while waiting)
    checkpoint: bool = False  # a checkpoint was requested: save one now
    applied: list[AuditEntry] = field(default_factory=list)  # entropy changes applied by this call


def controller_state(controller: Any, step: int | None = None) -> dict[str, Any]:
    """What the learner publishes: the controller's state_dict plus the step it was taken after."""
    return {**controller.state_dict(), "step": step, "updated_at": time.time()}


class RunSteering:
    def __init__(self, state: RunState, *, role: str = "learner", name: str = "learner-0", heartbeat_s: float = 2.0):
        self.state, self.role, self.name, self.heartbeat_s = state, role, name, heartbeat_s
        self._applied: list[AuditEntry] = []  # applied since the last after_step
        self._last_beat = float("-inf")
        self._info: dict[str, Any] = {}
        self._step: int | None = None
        self._replay: list[AuditEntry] = []  # applied after the resumed checkpoint, by applied step

    def start(
        self, controller: Any, step: int = 0, status: dict[str, Any] | None = None, *, resumed: bool = False
    ) -> None:
        """Publish the controller (so changes can be validated) and the starting status. `resumed`:
        the learner restored step `step` from a checkpoint (changes applied after it are replayed)."""
        self._step = step
        audit = self.state.audit(DEFAULT_MAX_AUDIT) if resumed else []
        self._replay = sorted(
            (e for e in audit if e.error is None and e.applied_step is not None and e.applied_step > step),
            key=lambda e: (e.applied_step, e.id),
        )
        if self._replay:
            log.info(
                "resumed at step %d: %d entropy change(s) applied after it will apply again at their steps (%s)",
                step,
                len(self._replay),
                ", ".join(f"#{e.id} at {e.applied_step}" for e in self._replay),
            )
        self.state.publish_controller(controller_state(controller, step))
        self.state.set_status(
            {
                "run_id": self.state.run_id,
                "phase": "training",
                "step": step,
                **(status or {}),
                "updated_at": time.time(),
            }
        )
        self.heartbeat(force=True)

    def before_step(self, controller: Any) -> StepDirectives:
        """Apply pending entropy changes; say whether to pause and whether to checkpoint."""
        next_step = (self._step or 0) + 1
        applied = self._replayed(controller, next_step)
        taken = self.state.take_entropy_changes()
        for entry in taken:
            reason = entry.error  # set for an entry that did not even parse
            if reason is None:
                try:
                    controller.reconfigure(**_as_config(entry.new))
                except (ValueError, TypeError) as err:  # pydantic's ValidationError is a ValueError
                    # moved under it since it was validated, or never validated (written to the store directly)
                    reason = _reason(err)
            if reason is not None:
                log.warning("entropy change %d from %s rejected: %s", entry.id, entry.who, reason)
                self.state.record_rejected(entry, next_step, f"not applied: {reason}")
                continue
            applied.append(entry)
        fresh = [e for e in applied if e.applied_step is None]
        if fresh:
            self.state.record_applied([e.id for e in fresh], next_step)
        if applied:
            self.state.publish_controller(controller_state(controller, self._step))
        self._applied.extend(applied)
        return StepDirectives(
            paused=self.state.paused(), checkpoint=self.state.take_checkpoint_request(), applied=applied
        )

    def _replayed(self, controller: Any, next_step: int) -> list[AuditEntry]:
        """Replay the changes due before `next_step` (applied step at most it); those it re-applied."""
        due = [e for e in self._replay if e.applied_step is not None and e.applied_step <= next_step]
        self._replay = self._replay[len(due) :]
        reapplied = []
        for entry in due:
            try:
                controller.reconfigure(**_as_config(entry.new))
            except (ValueError, TypeError) as err:  # the bounds it was applied under came from a lost change too
                log.warning(
                    "entropy change %d (applied at step %s) not applied again on resume: %s",
                    entry.id,
                    entry.applied_step,
                    _reason(err),
                )
                continue
            reapplied.append(entry)
        return reapplied

    def after_step(
        self, controller: Any, metrics: dict[str, Any], status: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Add the control fields to `metrics` (in place), publish metrics, status and controller state."""
        metrics["control_changes"] = len(self._applied)
        metrics["control_audit_ids"] = [e.id for e in self._applied]
        self._applied = []
        self._step = int(metrics.get("step", (self._step or 0) + 1))
        self.state.append_metrics(metrics)
        self.state.publish_controller(controller_state(controller, self._step))
        self.state.set_status(
            {
                "run_id": self.state.run_id,
                "phase": "training",
                "step": self._step,
                "weight_version": metrics.get("weight_version"),
                "nonfinite_steps": metrics.get("nonfinite_steps"),
                **(status or {}),
                "updated_at": time.time(),
            }
        )
        self.heartbeat(info={"step": self._step})
        return metrics

    def set_phase(self, phase: str, **extra: Any) -> None:
        """Update the status phase (starting, training, paused, finished, failed) keeping the rest."""
        status = self.state.status() or {"run_id": self.state.run_id}
        self.state.set_status({**status, **extra, "phase": phase, "updated_at": time.time()})

    def heartbeat(self, info: dict[str, Any] | None = None, *, force: bool = False, gone: bool = False) -> None:
        """`gone`: the last beat of a role that stops cleanly (listed as gone, then forgotten). Without
        `info` the beat carries the last info given (a background beat keeps the loop's step)."""
        now = time.monotonic()
        if info is not None:
            self._info = info
        if not force and not gone and now - self._last_beat < self.heartbeat_s:
            return
        self._last_beat = now
        self.state.beat(
            Heartbeat(
                role=self.role, name=self.name, pid=os.getpid(), host=socket.gethostname(), info=self._info, gone=gone
            )
        )

    @contextmanager
    def beating(self) -> Iterator[None]:
        """Heartbeats every heartbeat_s from a background thread while the block runs: the process is
        alive even when one step or evaluation outlasts dead_after_s (a role process has RoleRuntime's
        thread; this is the embedded `stare train`'s)."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(self.heartbeat_s):
                try:
                    self.heartbeat(force=True)
                except Exception as err:  # the store restarting: the next beat retries
                    log.warning("heartbeat failed: %s", err)

        thread = threading.Thread(target=loop, name="heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)


def _as_config(new: dict[str, Any]) -> dict[str, Any]:
    out = dict(new)
    if isinstance(out.get("band"), list):
        out["band"] = tuple(out["band"])
    return out


def _reason(err: Exception) -> str:
    if isinstance(err, ValidationError):
        first = err.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        if not first["loc"]:  # a cross-field rule: its message names the fields
            return message
        return f"{'.'.join(str(p) for p in first['loc'])}: {message} (got {first.get('input')!r:.80})"
    return str(err)[:300]
