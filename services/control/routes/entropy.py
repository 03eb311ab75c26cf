"""The entropy controller: GET its state, PUT/PATCH a change (validated, audited, applied by the
learner at its next optimizer step), GET the audit log."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request, status
from pydantic import ValidationError

from services.control.addresses import for_caller
from services.control.auth import WriteAuth
from services.control.deps import ActorDep, StateDep
from services.control.schemas import (
    EntropyAccepted,
    EntropyPatch,
    EntropyPut,
    EntropyView,
)
from stare.config.algo import ControllerConfig
from stare.runstate.base import AuditEntry, NoControllerError, RunStateMalformed, published_max_entropy

router = APIRouter(prefix="/entropy", tags=["entropy"])
_NO_CONTROLLER = {409: {"description": "No learner has published the controller yet"}}


@router.get(
    "",
    response_model=EntropyView,
    responses={404: {"description": "No controller state yet"}},
    summary="Target, band, gate, W, M, adaptive schedule, last entropy, pending changes",
)
def get_entropy(state: StateDep, request: Request) -> EntropyView:
    published = state.controller()
    if published is None:
        raise HTTPException(404, "no controller state yet: the learner publishes it when it starts training")
    config = published["config"]
    try:
        return EntropyView(
            **{k: config[k] for k in ControllerConfig.model_fields if k in config},
            gate=published["gate"],
            last_entropy=published.get("last_entropy"),
            step=published.get("step"),
            updated_at=published.get("updated_at"),
            max_entropy=published_max_entropy(published),
            pending=for_caller(state.pending_entropy_changes(), request),
        )
    except ValidationError as err:
        first = err.errors()[0]
        raise RunStateMalformed(
            f"run state: the learner's published controller does not validate: {'.'.join(map(str, first['loc']))}: "
            f"{first['msg']} (got {first.get('input')!r:.60}); something other than the learner wrote it: the learner "
            "publishes it again after its next step (or DEL the run's controller key in Redis)"
        ) from None


def _request(state, changes: dict[str, Any], who: str) -> EntropyAccepted:
    try:
        entry = state.request_entropy_change(changes, who)
    except NoControllerError as err:
        raise HTTPException(status.HTTP_409_CONFLICT, str(err)) from None
    return EntropyAccepted(audit=entry, pending=state.pending_entropy_changes())


@router.put(
    "",
    response_model=EntropyAccepted,
    status_code=202,
    dependencies=[WriteAuth],
    responses=_NO_CONTROLLER,
    summary="Set the target and band (absent band: none); other fields change only if given",
)
def put_entropy(body: EntropyPut, state: StateDep, who: ActorDep) -> EntropyAccepted:
    changes = body.model_dump(mode="json", exclude_unset=True)
    changes.setdefault("band", None)
    return _request(state, changes, who)


@router.patch(
    "",
    response_model=EntropyAccepted,
    status_code=202,
    dependencies=[WriteAuth],
    responses=_NO_CONTROLLER,
    summary="Change only the given fields",
)
def patch_entropy(body: EntropyPatch, state: StateDep, who: ActorDep) -> EntropyAccepted:
    return _request(state, body.model_dump(mode="json", exclude_unset=True), who)


@router.get(
    "/audit", response_model=list[AuditEntry], summary="Every change: who, when, old -> new, the step it applied at"
)
def get_audit(state: StateDep, request: Request, limit: int = Query(100, ge=1, le=1000)) -> list[AuditEntry]:
    return for_caller(state.audit(limit), request)
