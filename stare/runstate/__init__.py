"""Run state shared by the roles and the control plane (protocol, in-memory and Redis stores) and
`RunSteering`, the learner's adapter. See base.py for what is stored and steering.py for the loop side."""

from stare.runstate.base import (
    AuditEntry,
    CommandEntry,
    EntropyChangeError,
    Heartbeat,
    MetricsPage,
    NoControllerError,
    RoleHealth,
    RunState,
    RunStateUnavailable,
)
from stare.runstate.in_memory import MemoryRunState
from stare.runstate.steering import RunSteering, StepDirectives

__all__ = [
    "AuditEntry",
    "CommandEntry",
    "EntropyChangeError",
    "Heartbeat",
    "MemoryRunState",
    "MetricsPage",
    "NoControllerError",
    "RoleHealth",
    "RunSteering",
    "RunState",
    "RunStateUnavailable",
    "StepDirectives",
]
