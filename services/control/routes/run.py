"""Run commands: pause (the learner waits between steps), resume, checkpoint (saved at the next step
boundary, also while paused)."""

from __future__ import annotations

from fastapi import APIRouter

from services.control.auth import WriteAuth
from services.control.deps import StateDep
from services.control.schemas import RunCommandResult

router = APIRouter(prefix="/run", tags=["run"], dependencies=[WriteAuth])


def _result(state, message: str) -> RunCommandResult:
    return RunCommandResult(paused=state.paused(), checkpoint_requested=state.checkpoint_requested(), message=message)


@router.post("/pause", response_model=RunCommandResult, status_code=202, summary="Pause before the next step")
def pause(state: StateDep) -> RunCommandResult:
    state.set_paused(True)
    return _result(state, "the learner pauses before its next step")


@router.post("/resume", response_model=RunCommandResult, status_code=202, summary="Resume a paused run")
def resume(state: StateDep) -> RunCommandResult:
    state.set_paused(False)
    return _result(state, "the learner resumes")


@router.post(
    "/checkpoint",
    response_model=RunCommandResult,
    status_code=202,
    summary="Save a checkpoint at the next step boundary",
)
def checkpoint(state: StateDep) -> RunCommandResult:
    state.request_checkpoint()
    return _result(state, "the learner saves a checkpoint at its next step boundary")
