"""Reading the values the Redis run state holds, tolerantly: an entry that does not parse (written by
something other than stare, or by an older version) is skipped with a warning naming its key, a
pending change that does not parse becomes one the learner rejects and audits, and a counter that is
not a number is RunStateMalformed naming the key and the fix: an API read answers, never a bare 500."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from stare.runstate.base import AuditEntry, RunStateMalformed, unparsable_entry

log = logging.getLogger("stare.runstate.redis_state")  # the warnings keep the store's logger name
T = TypeVar("T")


def tolerant(raw: Any, parse: Callable[[Any], T], key: str) -> T | None:
    """THE read path of stored state: `parse(raw)`, or None for an entry that does not parse (written
    by something other than stare, or by an older version), with a warning naming the key and the
    entry: an API read skips it and answers, never a 500."""
    try:
        return parse(raw)
    except (ValueError, TypeError, KeyError) as err:
        log.warning("run state: skipped a malformed entry of %s (%s): %.200r", key, str(err).splitlines()[0][:200], raw)
        return None


def count(raw: Any, key: str) -> int:
    """A counter stare keeps at `key` (absent: 0); RunStateMalformed naming the key when it is not a number."""
    try:
        return int(raw or 0)
    except (TypeError, ValueError):
        raise RunStateMalformed(
            f"run state: {key} holds {str(raw)[:40]!r}, not a count; something other than stare wrote it: "
            f"redis-cli DEL {key} (it restarts at 0)"
        ) from None


def checked(value: Any, check: Callable[[Any], bool]) -> Any:
    if not check(value):
        raise ValueError(f"unexpected shape ({type(value).__name__})")
    return value


def is_controller(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("config"), dict) and isinstance(value.get("gate"), bool)


def entries(raw: list[Any], key: str) -> list[AuditEntry]:
    """Pending changes as the API reads them: malformed ones skipped (the learner's
    `take_entropy_changes` rejects and audits them)."""
    return [e for e in (tolerant(r, AuditEntry.model_validate_json, key) for r in raw) if e is not None]


def parsed(raw: str | bytes) -> AuditEntry:
    """An entry as stored; one that does not parse (not written by the control plane) becomes an
    entry the learner rejects and audits, instead of an exception in its loop or the API."""
    try:
        return AuditEntry.model_validate_json(raw)
    except ValueError as err:
        return unparsable_entry(raw, err)
