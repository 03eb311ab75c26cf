"""What a Redis stream parks in its dead-letter stream: the entry's raw fields as they were (or the
record re-encoded, or its repr), with the reason."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeadLetter:
    id: str  # the entry id in the dead-letter stream
    entry_id: str  # the original entry's id in its stream
    reason: str
    raw: dict[str, bytes]  # the original entry's fields (or the record's, re-encoded)


TRIMMED_REASON = "entry was trimmed (MAXLEN) before it was acknowledged; its content is lost"


def as_str(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


def raw_fields(raw: object) -> dict[str, bytes | str]:
    """The fields to park for `raw`: a record re-encoded, an entry's fields as they were, else repr."""
    if hasattr(raw, "to_fields"):
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


def parse_dead_letters(entries: list) -> list[DeadLetter]:
    """An XRANGE reply of a dead-letter stream as `DeadLetter`s."""
    out = []
    for dead_id, f in entries:
        raw = {as_str(k)[4:]: v for k, v in f.items() if as_str(k).startswith("raw:")}
        out.append(DeadLetter(as_str(dead_id), as_str(f[b"entry_id"]), f[b"reason"].decode(errors="replace"), raw))
    return out
