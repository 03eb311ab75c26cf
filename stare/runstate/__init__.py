"""Run state shared by the roles and the control plane (protocol, in-memory and Redis stores) and
`RunControl`, the learner's adapter. See base.py for what is stored and hooks.py for the loop side."""

from stare.runstate.base import (
    AuditEntry,
    EntropyChangeError,
    Heartbeat,
    MetricsPage,
    NoControllerError,
    RoleHealth,
    RunState,
    RunStateUnavailable,
)
from stare.runstate.hooks import RunControl, StepDirectives
from stare.runstate.memory import MemoryRunState

__all__ = [
    "AuditEntry", "EntropyChangeError", "Heartbeat", "MemoryRunState", "MetricsPage", "NoControllerError",
    "RoleHealth", "RunControl", "RunState", "RunStateUnavailable", "StepDirectives",
]
