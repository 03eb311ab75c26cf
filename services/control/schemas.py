"""Request and response bodies of the control-plane API (the OpenAPI schema is built from these).

The entropy request bodies are derived from `ControllerConfig`, so their bounds are the config's
bounds; cross-field rules (band order, W <= w_max, M >= m_min) are checked against the merged config
by `stare.runstate.base.validate_change`.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model
from pydantic_core import PydanticUndefined

from stare.config.algo import ControllerConfig
from stare.runstate.base import AuditEntry, CommandEntry, RoleHealth

log = logging.getLogger(__name__)

_BODY = ConfigDict(extra="forbid", allow_inf_nan=False)


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def _optional_fields(required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The config's fields, optional; only band takes null (it removes the band), the others are
    absent or a value, so the schema declares no null the API would refuse."""
    fields: dict[str, Any] = {}
    for name, info in ControllerConfig.model_fields.items():
        fi = copy.copy(info)
        if name in required:
            fi.default = PydanticUndefined
            fields[name] = (info.annotation, fi)
        elif name == "band":
            fi.default = None
            fields[name] = (info.annotation, fi)
        else:
            fi.default = None  # never validated: absent means unchanged (model_dump(exclude_unset=True))
            fi.json_schema_extra = _no_default
            fields[name] = (info.annotation, fi)
    return fields


EntropyPatch = create_model(
    "EntropyPatch",
    __config__=_BODY,
    __doc__="Change only the fields given (band: null removes the band).",
    **_optional_fields(),
)
EntropyPut = create_model(
    "EntropyPut",
    __config__=_BODY,
    __doc__="Set the target; band is set to the given value or removed when absent; other fields change only if given.",
    **_optional_fields(required=("target",)),
)


class _ControllerState(BaseModel):
    gate: bool
    last_entropy: float | None
    step: int | None = Field(description="The learner step this state was published after.")
    updated_at: float | None
    max_entropy: float | None = Field(
        None,
        description="ln V of the model's vocabulary: the largest target or "
        "band edge the learner accepts (null: only the config bound applies).",
    )
    pending: list[AuditEntry]


# The controller's config fields (whatever ControllerConfig has) plus its state and pending changes.
EntropyView = create_model(
    "EntropyView",
    __base__=_ControllerState,
    __doc__="The controller as the learner last published it, plus the changes waiting for its next step.",
    **{name: (info.annotation, copy.copy(info)) for name, info in ControllerConfig.model_fields.items()},
)


class EntropyAccepted(BaseModel):
    audit: AuditEntry
    pending: list[AuditEntry]
    applies: str = "at the learner's next optimizer step"


class RunCommandResult(BaseModel):
    paused: bool
    checkpoint_requested: bool
    message: str
    audit: CommandEntry = Field(description="The command's entry in the run's command audit log (GET /v1/run/audit).")


class StatusView(BaseModel):
    run_id: str
    phase: str = Field(
        description="waiting (no learner yet), starting, training, paused, finished, stopped, failed, or down: the "
        "learner said starting/training/paused but has sent no heartbeat for system.dead_after_s (15 s by default)"
    )
    last_phase: str | None = Field(None, description="With phase down: the phase the learner last wrote.")
    reason: str | None = Field(None, description="Why the phase is down or failed, and what to do.")
    step: int | None = None
    weight_version: int | None = None
    tokens_per_s: float | None = None
    nonfinite_steps: int | None = Field(None, description="Steps whose loss or gradient norm was NaN or infinite.")
    step_time_s: float | None = None
    queue_depths: dict[str, int] = Field(default_factory=dict)
    dead_letters: dict[str, int] = Field(default_factory=dict, description="Dead-lettered entries per stream.")
    staleness: dict[str, Any] = Field(default_factory=dict)
    paused: bool = Field(description="A pause is requested (the learner waits between steps).")
    checkpoint_requested: bool
    updated_at: float | None = None
    roles: list[RoleHealth]


class Health(BaseModel):
    status: str


_STATUS_FIELDS = (
    "step",
    "weight_version",
    "tokens_per_s",
    "nonfinite_steps",
    "step_time_s",
    "queue_depths",
    "dead_letters",
    "staleness",
    "updated_at",
    "reason",
    "phase",
)
_STATUS_TYPES = {name: TypeAdapter(StatusView.model_fields[name].annotation) for name in _STATUS_FIELDS}


def sanitized_status(written: dict[str, Any], key: str = "status") -> dict[str, Any]:
    """The learner's status fields that have their StatusView type; a field that does not (written by
    something other than the learner) is left out with a warning naming it, so one bad value never
    fails the whole answer. A status without a valid phase reads "unknown"."""
    fields: dict[str, Any] = {}
    for name, adapter in _STATUS_TYPES.items():
        value = written.get(name)
        if value is None:
            continue
        try:
            fields[name] = adapter.validate_python(value, strict=name == "phase")
        except ValidationError as err:
            log.warning("run state: %s.%s holds %.80r (%s): left out", key, name, value, err.errors()[0]["msg"])
    if "phase" not in fields:
        fields["phase"] = "waiting" if not written else "unknown"
    return fields
