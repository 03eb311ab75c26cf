"""Run commands: pause (the learner waits between steps), resume, checkpoint (saved at the next step
boundary, also while paused), each recorded in the run's command audit log (who, when); GET the log."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request

from services.control.addresses import for_caller
from services.control.auth import ReadAuth, WriteAuth
from services.control.deps import ActorDep, StateDep
from services.control.schemas import RunCommandResult
from stare.runstate.base import CommandEntry

router = APIRouter(prefix="/run", tags=["run"])


def _result(state, message: str, entry: CommandEntry) -> RunCommandResult:
    return RunCommandResult(
        paused=state.paused(), checkpoint_requested=state.checkpoint_requested(), message=message, audit=entry
    )


@router.post(
    "/pause",
    response_model=RunCommandResult,
    status_code=202,
    dependencies=[WriteAuth],
    summary="Pause before the next step",
)
def pause(state: StateDep, who: ActorDep) -> RunCommandResult:
    state.set_paused(True)
    return _result(state, "the learner pauses before its next step", state.record_command("pause", who))


@router.post(
    "/resume", response_model=RunCommandResult, status_code=202, dependencies=[WriteAuth], summary="Resume a paused run"
)
def resume(state: StateDep, who: ActorDep) -> RunCommandResult:
    state.set_paused(False)
    return _result(state, "the learner resumes", state.record_command("resume", who))


@router.post(
    "/checkpoint",
    response_model=RunCommandResult,
    status_code=202,
    dependencies=[WriteAuth],
    summary="Save a checkpoint at the next step boundary",
)
def checkpoint(state: StateDep, who: ActorDep) -> RunCommandResult:
    state.request_checkpoint()
    return _result(
        state, "the learner saves a checkpoint at its next step boundary", state.record_command("checkpoint", who)
    )


@router.get(
    "/audit",
    response_model=list[CommandEntry],
    dependencies=[ReadAuth],
    summary="Every pause, resume and checkpoint sent through the API: who and when (oldest first)",
)
def get_audit(state: StateDep, request: Request, limit: int = Query(100, ge=1, le=1000)) -> list[CommandEntry]:
    return for_caller(state.commands(limit), request)
