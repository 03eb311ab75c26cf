"""Reading a stream's dead letters as they come: which group (or evaluation sample) each one lost.

A dead-lettered entry never reaches the end of the pipeline, so whoever waits for it must learn
of it: the learner's `GroupCollector` closes a training group whose prompt or trajectory was
dead-lettered (else an on-policy step would wait for it for ever), and the stream evaluator counts
an evaluation sample lost. `DeadLetterFeed.new()` returns the dead letters parked since its last
call (from the stream's first one on the first call, so a restarted reader sees them all again:
readers must be idempotent). The group id is read from the parked record (the `json` field every
record here encodes, or the record itself in memory); entries that cannot be read (undecodable,
trimmed) have none, and neither have records that failed their tag (their group id is not to be
believed: a forger could otherwise close real groups).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from stare.transport.base import RecordStream, Transport
from stare.transport.record_tag import is_untrusted
from stare.transport.redis_dead_letters import range_entries
from stare.transport.redis_streams import RedisStream


@dataclass(frozen=True)
class DeadRecord:
    stream: str  # the stream the entry was parked from
    entry_id: str  # its id there
    reason: str
    group_id: str | None  # PromptTask / Trajectory.group_id, EvalTask.task_id; None when unreadable
    trajectory_id: str | None  # a Trajectory's id; None for a prompt or an unreadable entry


class DeadLetterFeed(Protocol):
    def new(self) -> list[DeadRecord]: ...


@runtime_checkable
class ParkingStream(Protocol):
    """An in-process stream that keeps its dead letters in a list (`MemoryStream`)."""

    @property
    def name(self) -> str: ...

    @property
    def dead(self) -> Sequence[tuple[str, object, str]]: ...  # (entry id, raw, reason)


def _ids(header: Any) -> tuple[str | None, str | None]:
    if not isinstance(header, dict):
        return None, None
    group = header.get("group_id", header.get("task_id"))
    trajectory = header.get("trajectory_id")
    return (group if isinstance(group, str) else None), (trajectory if isinstance(trajectory, str) else None)


def ids_of_fields(raw: dict[Any, Any]) -> tuple[str | None, str | None]:  # Any: parked fields as they were
    """(group id, trajectory id) of a parked entry's fields; (None, None) when unreadable."""
    payload = raw.get("json", raw.get(b"json"))
    if payload is None:
        return None, None
    try:
        return _ids(json.loads(payload))
    except (ValueError, UnicodeDecodeError):
        return None, None


def ids_of_record(raw: object) -> tuple[str | None, str | None]:
    """The same for what an in-memory stream parks (the record itself, or raw fields)."""
    if isinstance(raw, dict):
        return ids_of_fields(raw)
    group = getattr(raw, "group_id", getattr(raw, "task_id", None))
    trajectory = getattr(raw, "trajectory_id", None)
    return (group if isinstance(group, str) else None), (trajectory if isinstance(trajectory, str) else None)


class RedisDeadLetterFeed:
    """The dead letters of a `RedisStream` (XRANGE after the last id read)."""

    def __init__(self, stream: RedisStream[Any], batch: int = 500):
        self.stream, self.batch, self.after = stream, batch, "-"

    def new(self) -> list[DeadRecord]:
        out: list[DeadRecord] = []
        while True:
            after = self.after
            reply = self.stream._call(
                "XRANGE dead letters",
                lambda: self.stream.client.xrange(self.stream.dead_key, min=after, count=self.batch),
            )
            entries = range_entries(reply, f"XRANGE {self.stream.dead_key}")
            for _dead_id, fields in entries:
                f = {(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()}
                reason = _text(f.get("reason", b""))
                # a record that failed its tag names no group we believe: it closes none (record_tag.py)
                group, trajectory = (
                    (None, None)
                    if is_untrusted(reason)
                    else ids_of_fields({k[4:]: v for k, v in f.items() if k.startswith("raw:")})
                )
                out.append(DeadRecord(self.stream.name, _text(f.get("entry_id", b"")), reason, group, trajectory))
            if entries:
                last = _text(entries[-1][0])
                self.after = "(" + last
            if len(entries) < self.batch:
                return out


class MemoryDeadLetterFeed:
    """The dead letters of a `MemoryStream` (its `dead` list, by position)."""

    def __init__(self, stream: ParkingStream):
        self.stream, self.seen = stream, 0

    def new(self) -> list[DeadRecord]:
        fresh, self.seen = self.stream.dead[self.seen :], len(self.stream.dead)
        return [DeadRecord(self.stream.name, entry_id, reason, *ids_of_record(raw)) for entry_id, raw, reason in fresh]


def dead_letter_feed(stream: RecordStream[Any]) -> DeadLetterFeed:
    """The feed of a Redis or an in-memory stream."""
    if isinstance(stream, RedisStream):
        return RedisDeadLetterFeed(stream)
    if isinstance(stream, ParkingStream):
        return MemoryDeadLetterFeed(stream)
    raise TypeError(f"a {type(stream).__name__} keeps no dead letters a feed can read (neither Redis nor in-memory)")


class Feeds:
    """Several feeds read as one."""

    def __init__(self, feeds: list[DeadLetterFeed]):
        self.feeds = feeds

    def new(self) -> list[DeadRecord]:
        return [d for feed in self.feeds for d in feed.new()]


def training_dead_letters(transport: Transport) -> Feeds:
    """The dead letters of a run's three training streams (prompts, raw, scored) as one feed."""
    return Feeds([dead_letter_feed(s) for s in (transport.prompts, transport.raw, transport.scored)])


def _text(x: bytes | str) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else x
