"""Records a learner can trust: every record on a run's Redis streams carries a tag (HMAC-SHA256) made by
the role that wrote it with the run's record key, and is read only if its tag verifies.

Who writes what: the learner tags prompt and evaluation tasks (the rollout workers verify them), rollout
workers tag raw trajectories (the reward workers verify them), reward workers tag scored trajectories,
reward and evaluation results included (the learner verifies them). The tag covers the stream's key
(run and stream: a raw record copied into the scored stream, or another run's record, does not verify)
and every field of the entry, names and bytes, length-prefixed. A record whose tag is missing or wrong is
dead-lettered with a reason that starts "UntrustedRecord:" and is never delivered; since its group id is
not to be believed either, it closes no group (stare.transport.dead_letters).

The record key: HMAC-SHA256(secret, "stare record key v1" | run id), the secret being, first found:
the file STARE_RECORD_KEY_FILE names (a secret of its own: `stare up` writes one per run folder and gives
it to the learner, rollout and reward processes, not to the control plane), else the password in the
role's Redis URL (what every role already has), else none: then a key from the run id alone, which keeps
other runs' records and damaged ones out but no forger, and `record_key` says so.

What it does not protect (docs/transport.md, "Records a learner can trust"): anyone holding the secret
(every worker; with the password-derived key, anyone with the Redis password, the control plane included);
reading records (no confidentiality); deleting or delaying them; replaying a genuine record into its own
stream (harmless: a trajectory id is trained at most once). The embedded mode (`stare train`, in-memory
streams, one process) carries records as objects and neither tags nor checks them: every producer there
is the process's own code.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import unquote, urlsplit

from stare.transport.record_limits import RecordLimits
from stare.transport.records import RecordError
from stare.transport.redis_secrets import read_secret

log = logging.getLogger(__name__)

RECORD_KEY_FILE_ENV = "STARE_RECORD_KEY_FILE"
TAG_FIELD = "tag"
_KEY_CONTEXT = b"stare record key v1\x00"

T = TypeVar("T")


class UntrustedRecord(RecordError):
    """A record whose tag is missing or does not verify: not written by a role holding the run's key."""


def is_untrusted(reason: str) -> bool:
    """Whether a dead letter's reason says its record failed its tag (then nothing in it is believed)."""
    return reason.startswith(UntrustedRecord.__name__ + ":")


def record_key(run_id: str, redis_url: str, environ: Mapping[str, str] | None = None) -> tuple[bytes, str | None]:
    """The run's record key and where its secret came from (None: nowhere; see the module docstring)."""
    env = os.environ if environ is None else environ
    source: str | None
    if env.get(RECORD_KEY_FILE_ENV):
        secret, source = read_secret(env[RECORD_KEY_FILE_ENV], RECORD_KEY_FILE_ENV), RECORD_KEY_FILE_ENV
    elif (password := urlsplit(redis_url).password) is not None:
        secret, source = unquote(password), "the Redis password"
    else:
        secret, source = "", None
    key = hmac.new(secret.encode(), _KEY_CONTEXT + run_id.encode(), hashlib.sha256).digest()
    return key, source


def tag(key: bytes, stream: str, fields: Mapping[Any, Any]) -> bytes:
    """The tag of an entry's `fields` (its own `tag` field left out) on stream key `stream`."""
    h = hmac.new(key, stream.encode() + b"\x00", hashlib.sha256)
    for name, value in sorted((_text(k), _bytes(v)) for k, v in fields.items()):
        if name == TAG_FIELD:
            continue
        raw = name.encode()
        h.update(len(raw).to_bytes(4, "little") + raw + len(value).to_bytes(8, "little") + value)
    return h.hexdigest().encode()


@dataclass(frozen=True)
class RecordTrust:
    """What a role's streams need to write tagged records and read only trusted, bounded ones."""

    key: bytes
    training: RecordLimits | None = None  # bounds of the prompts / raw / scored streams' records
    evaluation: RecordLimits | None = None  # bounds of the evaluation streams' records

    def codec(self, record_cls: Any, stream: str, limits: RecordLimits | None) -> RecordCodec[Any]:
        return RecordCodec(record_cls, self.key, stream, limits)


class RecordCodec(Generic[T]):
    """A record class's codec on one stream (`stream`: its Redis key) with tags and bounds: `encode` adds
    the tag; `from_fields` checks the tag, then decodes and validates, then checks `limits`, each failure a
    RecordError naming what failed (the stream dead-letters the entry with it)."""

    def __init__(self, record_cls: Any, key: bytes, stream: str, limits: RecordLimits | None = None):
        self.record_cls, self.key, self.stream, self.limits = record_cls, key, stream, limits

    def encode(self, record: Any) -> dict[str, bytes]:
        fields: dict[str, bytes] = record.to_fields()
        fields[TAG_FIELD] = tag(self.key, self.stream, fields)
        return fields

    def from_fields(self, data: Mapping[Any, Any]) -> T:
        got = data.get(TAG_FIELD, data.get(TAG_FIELD.encode()))
        if got is None:
            raise UntrustedRecord(
                f"untrusted record on {self.stream}: it has no tag (not written by a role of this run; "
                f"a role without the run's record key, or an older stare?)"
            )
        if not hmac.compare_digest(_bytes(got), tag(self.key, self.stream, data)):
            raise UntrustedRecord(
                f"untrusted record on {self.stream}: its tag does not verify (written without this run's record "
                f"key, altered in Redis, or copied from another stream or run; every role must have the same "
                f"{RECORD_KEY_FILE_ENV} or Redis password)"
            )
        record: T = self.record_cls.from_fields(data)
        if self.limits is not None:
            self.limits.check(record)
        return record


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _bytes(x: Any) -> bytes:
    if isinstance(x, bytes):
        return x
    return str(x).encode()
