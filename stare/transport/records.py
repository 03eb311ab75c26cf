"""Wire records that cross process seams: prompt tasks and trajectories.

Invariants (checked by `validate`, which raises `RecordError` naming the field):
  * every per-token array of a Trajectory has the length of `response_token_ids`;
  * `loss_mask` is 1 on tokens the model generated and trains on, 0 on tool observations;
  * `response_logprobs` are the rollout engine's log-probs of the sampled tokens (<= 0);
  * `trajectory_id` is unique per run: the learner trains a trajectory id at most once;
  * `weight_version` is the policy version that generated its first response token; a response
    sampled across weight updates (`system.inflight_weight_updates`) lists where each later version
    starts in `version_starts` ([[token index, version], ...], indices and versions increasing, every
    version above `weight_version`); empty: every token came from `weight_version`.
Arrays travel packed (`to_fields` / `from_fields`: little-endian raw bytes plus a JSON header),
never as JSON lists; `schema` is checked on decode.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeAlias, TypeVar, cast

import numpy as np

# 2: PromptTask.min_weight_version; 3: Trajectory.version_starts; 4: extra_info and prompt (a row's, for a
# reward function of the user's own)
SCHEMA_VERSION = 4
READABLE_SCHEMAS = (2, 3, 4)  # an older record reads as schema 4 with its defaults (one version, no row fields)

Fields: TypeAlias = Mapping[str, bytes] | Mapping[bytes, bytes]
"""A record's stream fields: str keys as `to_fields` writes them, bytes keys as Redis returns them."""


class RecordError(ValueError):
    """A record that breaks its invariants; the message names the field."""


@dataclass
class PromptTask:
    """One prompt to sample `group_size` completions for."""

    run_id: str
    group_id: str  # unique per run; the group's trajectories share it
    prompt: str
    prompt_token_ids: list[int]
    answer: str  # ground truth for the verifier
    problem_id: str
    data_source: str
    group_size: int
    level: int = 0
    cursor: int = 0  # position in the data stream (for resume)
    # Sample with weights of at least this version: the learner sets it so that what it gets back
    # is at most max_staleness versions old when it trains on it (0: any weights).
    min_weight_version: int = 0
    # the dataset row's extra_info (JSON values; {} without one), read by a reward function of the user's own
    extra_info: dict[str, Any] = field(default_factory=dict)
    schema: int = SCHEMA_VERSION

    def to_fields(self) -> dict[str, bytes]:
        return {"json": json.dumps(asdict(self)).encode()}

    @classmethod
    def from_fields(cls, data: Fields) -> PromptTask:
        return _from_json_fields(cls, data)


@dataclass
class EvalTask:
    """One held-out prompt to sample for an evaluation: `n` completions with the evaluation's own
    sampling settings (greedy: n 1, temperature 0). Its trajectories carry `group_id = task_id`,
    ids `<task_id>:<sample>`, and travel on the evaluation streams, never the training ones.

    Invariants: `task_id` is `<eval_id>/<problem index>/<greedy|sampled>` (stare.evaluation.heldout); the
    worker samples with weights of at least `min_weight_version` (the version under evaluation)
    and seeds prompt i of a call with its own `seed`, so the samples do not depend on batching."""

    run_id: str
    eval_id: str
    task_id: str
    prompt_token_ids: list[int]
    answer: str
    problem_id: str
    data_source: str
    level: int
    n: int
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    min_weight_version: int
    # the prompt's text and its row's extra_info, for a reward function of the user's own (else empty)
    prompt: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)
    schema: int = SCHEMA_VERSION

    def to_fields(self) -> dict[str, bytes]:
        return {"json": json.dumps(asdict(self)).encode()}

    @classmethod
    def from_fields(cls, data: Fields) -> EvalTask:
        task = _from_json_fields(cls, data)
        if task.n < 1:
            raise RecordError(f"EvalTask.n must be >= 1, got {task.n}")
        return task


_ARRAYS = {
    "prompt_token_ids": np.int32,
    "response_token_ids": np.int32,
    "response_logprobs": np.float32,
    "loss_mask": np.uint8,
}


@dataclass
class Trajectory:
    run_id: str
    trajectory_id: str
    group_id: str
    group_size: int
    weight_version: int
    prompt_token_ids: np.ndarray  # [P] int32
    response_token_ids: np.ndarray  # [R] int32
    response_logprobs: np.ndarray  # [R] float32
    loss_mask: np.ndarray  # [R] uint8
    finish_reason: str
    answer: str
    problem_id: str
    data_source: str
    response_text: str = ""
    level: int = 0
    reward: float | None = None
    reward_info: dict[str, Any] = field(default_factory=dict)
    turns: int = 1
    # [[token index, version], ...]: the response tokens from index i on were sampled with `version`
    # (in-flight weight updates); empty: all with weight_version
    version_starts: list[list[int]] = field(default_factory=list)
    # the prompt's text and its row's extra_info, copied by the rollout worker when the reward has a function
    # of the user's own that reads them (RewardConfig.needs_rows); empty otherwise (no bytes on the wire)
    prompt: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict)
    schema: int = SCHEMA_VERSION

    def token_versions(self) -> np.ndarray:
        """The weight version of every response token: [R] int64."""
        out = np.full(len(self.response_token_ids), self.weight_version, dtype=np.int64)
        for start, version in self.version_starts:
            out[start:] = version
        return out

    @property
    def newest_version(self) -> int:
        """The version of the last response token (weight_version when it was sampled with one version)."""
        return self.version_starts[-1][1] if self.version_starts else self.weight_version

    def validate(self) -> Trajectory:
        n = len(self.response_token_ids)
        for name in ("response_logprobs", "loss_mask"):
            if len(getattr(self, name)) != n:
                raise RecordError(
                    f"Trajectory.{name} has length {len(getattr(self, name))}, "
                    f"expected {n} (the length of response_token_ids)"
                )
        if n == 0:
            raise RecordError("Trajectory.response_token_ids is empty; a trajectory needs at least one token")
        if len(self.prompt_token_ids) == 0:
            raise RecordError("Trajectory.prompt_token_ids is empty")
        if not np.all(np.isfinite(self.response_logprobs)) or np.any(self.response_logprobs > 1e-4):
            raise RecordError("Trajectory.response_logprobs must be finite log-probabilities (<= 0)")
        if self.group_size < 1:
            raise RecordError(f"Trajectory.group_size must be >= 1, got {self.group_size}")
        if self.weight_version < 0:
            raise RecordError(f"Trajectory.weight_version must be >= 0, got {self.weight_version}")
        last_start, last_version = 0, self.weight_version
        for pair in self.version_starts:
            if len(pair) != 2 or not last_start < pair[0] < n or pair[1] <= last_version:
                raise RecordError(
                    f"Trajectory.version_starts must be [token index, version] pairs with indices in "
                    f"(0, {n}) and versions above weight_version ({self.weight_version}), both increasing; "
                    f"got {self.version_starts}"
                )
            last_start, last_version = pair
        if self.reward is not None and not np.isfinite(self.reward):
            raise RecordError(f"Trajectory.reward must be finite, got {self.reward}")
        return self

    def to_fields(self) -> dict[str, bytes]:
        header = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _ARRAYS}
        out = {"json": json.dumps(header).encode()}
        for name, dtype in _ARRAYS.items():
            out[name] = np.ascontiguousarray(getattr(self, name), dtype=np.dtype(dtype).newbyteorder("<")).tobytes()
        return out

    @classmethod
    def from_fields(cls, data: Fields) -> Trajectory:
        header = _schema_checked(cls, json.loads(_get(data, "json")))
        arrays: dict[str, Any] = {  # Any: keyword arguments of differently typed fields, like the header's
            name: np.frombuffer(_get(data, name), dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)
            for name, dtype in _ARRAYS.items()
        }
        try:
            return cls(**header, **arrays).validate()
        except TypeError as err:
            raise RecordError(f"Trajectory fields do not match schema {SCHEMA_VERSION}: {err}") from None


_JsonRecord = TypeVar("_JsonRecord", PromptTask, EvalTask)


def _from_json_fields(cls: type[_JsonRecord], data: Fields) -> _JsonRecord:
    """A JSON-encoded record (PromptTask, EvalTask) from its stream fields, its schema checked."""
    raw = _schema_checked(cls, json.loads(_get(data, "json")))
    try:
        return cls(**raw)
    except TypeError as err:
        raise RecordError(f"{cls.__name__} fields do not match schema {SCHEMA_VERSION}: {err}") from None


def _schema_checked(cls: type, header: dict[str, Any]) -> dict[str, Any]:
    """A record's JSON header read at this build's schema: a readable older schema is raised to it."""
    if header.get("schema") not in READABLE_SCHEMAS:
        raise RecordError(
            f"{cls.__name__}.schema is {header.get('schema')!r}, this build reads "
            f"{', '.join(map(str, READABLE_SCHEMAS))}"
        )
    return {**header, "schema": SCHEMA_VERSION}


def _get(fields_: Fields, key: str) -> bytes:
    data = cast(Mapping[str | bytes, bytes], fields_)  # a lookup by the other key kind just misses
    if key in data:
        return data[key]
    if key.encode() in data:
        return data[key.encode()]
    raise RecordError(f"record is missing field {key!r}")
