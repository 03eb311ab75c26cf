"""What a Redis stream parks in its dead-letter stream: the entry's raw fields as they were (or the
record re-encoded, or its repr), with the reason."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import redis
from redis.typing import EncodableT

from stare.transport.base import WireRecord

FieldValue: TypeAlias = bytes | str | int | float
"""A value XADD stores."""
Entry: TypeAlias = tuple[str, dict[bytes, bytes]]
"""A stream entry as a client without decode_responses reads it: (id, fields)."""
DeadItem: TypeAlias = tuple[str, Mapping[str, FieldValue] | Mapping[bytes, bytes], str]
"""An entry to park: (entry id, its raw fields, the reason)."""


@dataclass(frozen=True)
class DeadLetter:
    id: str  # the entry id in the dead-letter stream
    entry_id: str  # the original entry's id in its stream
    reason: str
    raw: dict[str, bytes]  # the original entry's fields (or the record's, re-encoded)


TRIMMED_REASON = "entry was trimmed (MAXLEN) before it was acknowledged; its content is lost"


def as_str(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


def raw_fields(raw: object) -> Mapping[str, FieldValue]:
    """The fields to park for `raw`: a record re-encoded, an entry's fields as they were, else repr."""
    if isinstance(raw, WireRecord):  # has to_fields
        try:
            return raw.to_fields()
        except Exception as err:  # an invalid record may not even encode; keep what we can
            return {"repr": repr(raw)[:100_000], "encode_error": f"{type(err).__name__}: {err}"}
    if isinstance(raw, dict):
        return {
            as_str(k) if isinstance(k, (bytes, str)) else repr(k): v
            if isinstance(v, (bytes, str, int, float))
            else repr(v)
            for k, v in raw.items()
        }
    if isinstance(raw, (bytes, str)):
        return {"raw": raw}
    return {"repr": repr(raw)[:100_000]}


def range_entries(reply: list[Any] | None, what: str) -> list[Any]:
    """An XRANGE reply: a list of (id, fields). redis-py's type allows a null reply, which Redis never sends."""
    if reply is None:
        raise redis.ResponseError(f"{what}: a null XRANGE reply")
    return reply


def parse_dead_letters(entries: list[Any]) -> list[DeadLetter]:
    """An XRANGE reply of a dead-letter stream as `DeadLetter`s."""
    out = []
    for dead_id, f in entries:
        raw = {as_str(k)[4:]: v for k, v in f.items() if as_str(k).startswith("raw:")}
        out.append(DeadLetter(as_str(dead_id), as_str(f[b"entry_id"]), f[b"reason"].decode(errors="replace"), raw))
    return out


def park(client: redis.Redis, key: str, group: str, dead_key: str, maxlen: int, items: list[DeadItem]) -> None:
    """Park `items` (entry id, raw fields, reason) in the dead-letter stream and acknowledge them in one
    MULTI: parked and acknowledged together, or neither."""
    pipe = client.pipeline(transaction=True)
    for entry_id, raw, reason in items:
        fields: dict[EncodableT, EncodableT] = {"reason": reason, "entry_id": entry_id, "stream": key, "group": group}
        fields.update({f"raw:{as_str(k)}": v for k, v in raw.items()})
        pipe.xadd(dead_key, fields, maxlen=maxlen, approximate=True)
    ids = [i for i, _, _ in items]
    pipe.xack(key, group, *ids)
    pipe.xdel(key, *ids)  # parked: gone from the stream (redis_backlog.py: a stream holds its unacknowledged entries)
    pipe.execute()


def poisoned(
    client: redis.Redis, key: str, group: str, failures_key: str, max_deliveries: int, claimed: list[Entry]
) -> list[DeadItem]:
    """The claimed entries delivered more than `max_deliveries` times (a record that keeps killing or
    stalling its consumers), each with the reason to park it under (its last recorded error if any)."""
    pipe = client.pipeline(transaction=False)
    for i, _ in claimed:
        pipe.xpending_range(key, group, min=i, max=i, count=1)
    times = {as_str(r["message_id"]): r["times_delivered"] for rows in pipe.execute() for r in rows}
    poison = [(i, f) for i, f in claimed if times.get(i, 0) > max_deliveries]
    if not poison:
        return []
    errors = client.hmget(failures_key, [i for i, _ in poison])
    return [
        (
            i,
            f,
            f"delivered {times[i] - 1} times without an ack (max_deliveries={max_deliveries}); "
            + (f"last error: {as_str(e)}" if e is not None else "its consumer died or stalled on it each time"),
        )
        for (i, f), e in zip(poison, errors)
    ]
