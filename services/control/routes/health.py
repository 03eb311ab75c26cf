"""Liveness (the process answers) and readiness (the run state store answers)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from services.control.deps import StateDep
from services.control.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health, summary="Liveness: the API process answers")
async def health() -> Health:  # async: answered on the event loop, never queued behind the thread pool
    return Health(status="ok")


@router.get(
    "/ready",
    response_model=Health,
    responses={503: {"model": Health}},
    summary="Readiness: the run state store (Redis) answers PING",
)
def ready(state: StateDep):
    if state.ping():
        return Health(status="ready")
    return JSONResponse({"status": "run state store unreachable"}, status_code=503)
