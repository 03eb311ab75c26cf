"""The run-state protocol: everything the control plane reads and writes about a running run.

The control plane keeps no state of its own; the learner and the other roles write here, the API
reads here, and user requests (entropy changes, pause/resume/checkpoint) wait here until the
learner takes them at its next step boundary. Two implementations with identical semantics:
`MemoryRunState` (embedded `stare train`, unit tests) and `RedisRunState` (the distributed
system); both pass tests/control/test_runstate_contract.py.

What lives here:
* role heartbeats (role, name, pid, host, info, timestamp, gone); a role is alive while its last
  beat is newer than `dead_after_s` and it has not said it left (`gone`: its last beat on a clean
  exit). A role that is not alive stays listed for `forget_after_s` after its last beat, then
  `roles()` no longer lists it (and the Redis store deletes it), so redeploys leave no ghosts;
* the run status the learner writes (phase, step, weight version, throughput, queue depths,
  staleness) as a free-form JSON object; a reader takes its phase only while the learner's heartbeat
  is fresh: `effective_phase` turns starting/training/paused into "down" once no learner is alive;
* the metrics history, one JSON object per step, under absolute indexes 0, 1, 2, ... (the oldest
  are dropped past `max_metrics`; `metrics_page(offset)` is also the "since" read of the SSE stream);
* the entropy controller: the state the learner publishes after each step, and requested changes,
  validated against `ControllerConfig` merged with the published config and earlier pending
  changes, each with an audit entry {id, who, when, old, new} and, once the learner applied it,
  the step it applied at (or the reason it could not);
* run commands: paused (a flag the learner honours between steps) and checkpoint requests, and
  their audit log {id, who, when, command} (pause, resume, checkpoint through the API).

Not covered: authentication (the API's job).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field, ValidationError

from stare.config.algo import ControllerConfig, merge_config

DEFAULT_MAX_METRICS = 10_000
DEFAULT_MAX_AUDIT = 1_000
DEFAULT_FORGET_AFTER_S = 300.0  # system.forget_after_s's default
# The fields of ControllerConfig a user may change at run time.
SETTABLE_FIELDS = tuple(ControllerConfig.model_fields)


class RunStateUnavailable(RuntimeError):
    """The store did not answer within its retry budget (Redis down or restarting)."""


class RunStateMalformed(RuntimeError):
    """A value in the store is not what stare writes there (another Redis type under a run-state key, a
    number that is not one, a published state that does not validate): something else wrote it. The
    message names the key and the fix; the API answers 500 with it, never a bare traceback."""


class NoControllerError(LookupError):
    """No learner has published its controller state yet, so a change cannot be validated."""


class EntropyChangeError(ValueError):
    """A requested controller change is invalid; `field` names the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


class Heartbeat(BaseModel):
    """One role's last sign of life. `at` is the sender's wall clock (unix seconds)."""

    role: str = Field(min_length=1, max_length=64)
    name: str = Field(min_length=1, max_length=128)
    pid: int = Field(ge=0)
    host: str = Field(max_length=255)
    info: dict[str, Any] = Field(default_factory=dict)
    at: float = Field(default_factory=time.time)
    gone: bool = Field(False, description="The role's last beat: it stopped cleanly (not a crash).")


class RoleHealth(Heartbeat):
    alive: bool
    age_s: float
    state: Literal["alive", "down", "gone"] = Field(
        description="alive: a heartbeat within dead_after_s; gone: its last beat said it stopped cleanly; down: "
        "no heartbeat for dead_after_s (crashed, killed, or a manual `docker kill`)"
    )


class AuditEntry(BaseModel):
    """One requested controller change: `old` and `new` hold the changed fields only.
    `applied_step` is the learner step that first ran with it (None while pending);
    `error` says why the learner could not apply it."""

    id: int
    who: str
    when: float
    old: dict[str, Any]
    new: dict[str, Any]
    applied_step: int | None = None
    error: str | None = None


RunCommand = Literal["pause", "resume", "checkpoint"]


class CommandEntry(BaseModel):
    """One run command sent through the control plane (who as the audit log of entropy changes)."""

    id: int
    who: str
    when: float
    command: RunCommand


class MetricsPage(BaseModel):
    """Metrics at absolute indexes [offset, next). `first` is the oldest index still kept,
    `total` the number ever appended (the index the next step will get)."""

    items: list[dict[str, Any]]
    offset: int
    next: int
    first: int
    total: int


class RunState(Protocol):
    run_id: str
    dead_after_s: float

    def ping(self) -> bool: ...

    def beat(self, heartbeat: Heartbeat) -> None: ...

    def roles(self) -> list[RoleHealth]: ...

    def claim_name(self, role: str, name: str, holder: str, ttl_s: float) -> bool:
        """Reserve the worker name `role/name` for `holder` for `ttl_s`: False if another holder has it."""
        ...

    def set_status(self, status: dict[str, Any]) -> None: ...

    def status(self) -> dict[str, Any] | None: ...

    def append_metrics(self, metrics: dict[str, Any]) -> int:
        """Append one step's metrics; returns its absolute index."""
        ...

    def metrics_page(self, offset: int = 0, limit: int = 100) -> MetricsPage:
        """Up to `limit` entries from absolute index `offset` (clamped to the oldest kept);
        a negative offset counts from the end (-10: the last ten)."""
        ...

    def publish_controller(self, state: dict[str, Any]) -> None: ...

    def controller(self) -> dict[str, Any] | None: ...

    def request_entropy_change(self, changes: dict[str, Any], who: str) -> AuditEntry:
        """Validate and queue a change (EntropyChangeError, NoControllerError); returns its audit entry."""
        ...

    def pending_entropy_changes(self) -> list[AuditEntry]: ...

    def take_entropy_changes(self) -> list[AuditEntry]:
        """Atomically remove and return the pending changes, oldest first (the learner calls this)."""
        ...

    def record_applied(self, ids: list[int], step: int, error: str | None = None) -> None: ...

    def record_rejected(self, entry: AuditEntry, step: int, reason: str) -> None:
        """The learner refused `entry`: mark its audit entry with `reason`, or, when the audit log has
        no such entry (it was written to the store directly, not through the API), append it with a
        fresh id, its `who` marked as not from the control plane."""
        ...

    def audit(self, limit: int = 100) -> list[AuditEntry]:
        """The last `limit` audit entries, oldest first, with their applied step or error."""
        ...

    def set_paused(self, paused: bool) -> None: ...

    def paused(self) -> bool: ...

    def request_checkpoint(self) -> None: ...

    def checkpoint_requested(self) -> bool: ...

    def take_checkpoint_request(self) -> bool: ...

    def record_command(self, command: RunCommand, who: str) -> CommandEntry:
        """Append a run command to its audit log (trimmed to the last max_audit); returns its entry."""
        ...

    def commands(self, limit: int = 100) -> list[CommandEntry]:
        """The last `limit` run commands, oldest first."""
        ...


# -- shared logic of both implementations -------------------------------------------------------

_FIELD_IN_MESSAGE = re.compile(r"controller\.(\w+)")


def merged_config(published: dict[str, Any] | None, pending: list[AuditEntry]) -> dict[str, Any]:
    """The config the learner will run with once the pending changes apply."""
    if published is None:
        raise NoControllerError(
            "no controller state yet: the learner publishes it when it starts; retry once the run is training"
        )
    config = dict(published["config"])
    for entry in pending:
        config.update(entry.new)
    return config


def validate_change(
    current: dict[str, Any], changes: dict[str, Any], max_entropy: float | None = None
) -> ControllerConfig:
    """`current` merged with `changes`, validated as a whole (bounds, strict types, target and band at
    most `max_entropy` = ln V when the learner published it); raises EntropyChangeError naming the field."""
    if not changes:
        raise EntropyChangeError("body", f"no field to change; give at least one of {', '.join(SETTABLE_FIELDS)}")
    for key in changes:
        if key not in SETTABLE_FIELDS:
            raise EntropyChangeError(key, f"unknown field; settable fields are {', '.join(SETTABLE_FIELDS)}")
    try:
        return merge_config(current, changes, max_entropy)
    except ValidationError as err:
        first = err.errors()[0]
        loc = [str(p) for p in first["loc"]]
        field = loc[0] if loc else (_FIELD_IN_MESSAGE.findall(first["msg"]) or ["body"])[0]
        message = first["msg"].removeprefix("Value error, ")
        raise EntropyChangeError(
            field, f"{message} (got {({**current, **changes}).get(field)!r}); send a value that satisfies this"
        ) from None
    except ValueError as err:  # above ln V
        field = (_FIELD_IN_MESSAGE.findall(str(err)) or ["body"])[0]
        raise EntropyChangeError(field, str(err).split(": ", 1)[-1]) from None


def plan_change(
    entry_id: int,
    current: dict[str, Any],
    changes: dict[str, Any],
    who: str,
    when: float,
    max_entropy: float | None = None,
) -> AuditEntry:
    """Validate `changes` against `current` and build its audit entry (changed fields only)."""
    config = validate_change(current, changes, max_entropy).model_dump(mode="json")
    new = {k: config[k] for k in changes}
    old = {k: current.get(k) for k in changes}
    return AuditEntry(id=entry_id, who=who, when=when, old=old, new=new)


def published_max_entropy(published: dict[str, Any] | None) -> float | None:
    """ln V as the learner published it with its controller (None: unknown)."""
    value = (published or {}).get("max_entropy")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def unparsable_entry(raw: Any, err: Exception) -> AuditEntry:
    """What the learner sees for a pending entry that is not an AuditEntry (written to the store by
    something other than the control plane): an entry it will reject, with the raw text kept."""
    return AuditEntry(
        id=0,
        who="unknown (a malformed pending entry in the store)",
        when=time.time(),
        old={},
        new={"raw": str(raw)[:500]},
        error=f"malformed: {str(err)[:300]}",
    )


def rejected_entry(entry: AuditEntry, audit: list[AuditEntry], next_id: int) -> AuditEntry | None:
    """None when `entry` is in `audit` (the API validated and logged it); else the copy to append."""
    if any(e.id == entry.id and e.new == entry.new and e.who == entry.who for e in audit):
        return None
    return entry.model_copy(update={"id": next_id, "who": f"{entry.who} [not from the control plane]"[:300]})


def json_safe(value: Any) -> Any:
    """A copy with NaN and infinities replaced by None (strict JSON: browsers and Prometheus read it)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def page_bounds(first: int, total: int, offset: int, limit: int) -> tuple[int, int]:
    """Absolute [start, stop) of a page over entries first..total-1."""
    start = total + offset if offset < 0 else offset
    start = min(max(start, first), total)
    return start, min(start + max(limit, 0), total)


def role_health(heartbeat: Heartbeat, dead_after_s: float, now: float) -> RoleHealth:
    age = max(now - heartbeat.at, 0.0)
    alive = age < dead_after_s and not heartbeat.gone
    state: Literal["alive", "down", "gone"] = "gone" if heartbeat.gone else ("alive" if alive else "down")
    return RoleHealth(**heartbeat.model_dump(), alive=alive, age_s=age, state=state)


# The phases a learner writes while it runs; a reader believes them only while a learner is alive.
ACTIVE_PHASES = frozenset({"starting", "training", "paused"})


def effective_phase(written: Mapping[str, Any], roles: Sequence[RoleHealth], dead_after_s: float) -> dict[str, Any]:
    """The status fields that follow the learner's heartbeat: {} while the phase the learner wrote
    stands (it is not an active phase, or a learner role is alive), else {"phase": "down",
    "last_phase": what it wrote, "reason": why, and what to do}. A learner's heartbeat thread beats
    every system.heartbeat_s, so a dead learner reads "down" between dead_after_s - heartbeat_s and
    dead_after_s after it died (13-15 s at the defaults)."""
    phase = written.get("phase")
    if phase not in ACTIVE_PHASES:
        return {}
    learners = [r for r in roles if r.role == "learner"]
    if any(r.alive for r in learners):
        return {}
    if not learners:
        why = "no learner heartbeat is listed (its last is older than system.forget_after_s)"
    else:
        last = min(learners, key=lambda r: r.age_s)
        why = (
            f"learner {last.name}'s last heartbeat, {last.age_s:.0f} s ago, said it stopped"
            if last.gone
            else f"no heartbeat from learner {last.name} for {last.age_s:.1f} s (system.dead_after_s {dead_after_s:g} s)"
        )
    step = written.get("step")
    at_step = f" at step {step}" if isinstance(step, int) and not isinstance(step, bool) else ""
    return {
        "phase": "down",
        "last_phase": phase,
        "reason": f"{why}; it last said {phase}{at_step}; start it again (compose: docker compose up -d; it "
        "resumes from its newest checkpoint)",
    }


def forgotten(health: RoleHealth, forget_after_s: float) -> bool:
    """A role that is not alive and whose last beat is `forget_after_s` old: no longer listed."""
    return not health.alive and health.age_s >= forget_after_s
