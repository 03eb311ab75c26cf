"""GET /v1/status: the run's phase and progress (written by the learner) and each role's liveness.
The phase follows the learner's heartbeat: stare.runstate.base.effective_phase."""

from __future__ import annotations

from fastapi import APIRouter, Request

from services.control.deps import StateDep
from services.control.schemas import StatusView, sanitized_status
from stare.runstate.base import effective_phase

router = APIRouter(tags=["status"])


@router.get("/status", response_model=StatusView, summary="Run id, phase, step, throughput, queues, staleness, roles")
def get_status(state: StateDep, request: Request) -> StatusView:
    written = state.status() or {}  # the learner's fields; the rest is read here
    fields = sanitized_status(written)
    roles = state.roles()
    fields |= effective_phase(fields, roles, state.dead_after_s)
    return StatusView(
        run_id=request.app.state.run_id,
        **fields,
        paused=state.paused(),
        checkpoint_requested=state.checkpoint_requested(),
        roles=roles,
    )
