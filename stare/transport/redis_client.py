"""The Redis client every role builds (socket timeouts, no hidden retries), the run's key names, and
`retrying`: one plain call retried over a lost connection with logged backoff."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger(__name__)

R = TypeVar("R")

_NAME = re.compile(r"^[A-Za-z0-9._-]+$")  # the run-name rule of stare.config: no ':' in key parts
RETRYABLE_ERRORS = (redis.ConnectionError, redis.TimeoutError)  # BusyLoadingError is a ConnectionError


def stream_key(run_id: str, name: str) -> str:
    return f"stare:{checked_key_part(run_id, 'run_id')}:stream:{checked_key_part(name, 'name')}"


def run_key(run_id: str, name: str) -> str:
    """A run-scoped key for anything else a run keeps in Redis (weights pointer, state)."""
    return f"stare:{checked_key_part(run_id, 'run_id')}:{name}"


def dead_key(run_id: str, name: str) -> str:
    return f"stare:{checked_key_part(run_id, 'run_id')}:dead:{checked_key_part(name, 'name')}"


def checked_key_part(value: str, what: str) -> str:
    """`value` if it can be part of a run's Redis key names (no ':'), else ValueError naming `what`."""
    if not _NAME.match(value):
        raise ValueError(f"{what} {value!r} must match {_NAME.pattern} (it is part of Redis key names)")
    return value


def connect_client(
    url: str, *, socket_timeout_s: float = 5.0, decode_responses: bool = False, encoding_errors: str = "strict"
) -> redis.Redis:
    """A client with socket timeouts on every call and no hidden client-side retries (callers retry
    with `retrying` or RedisStream, logged): every Redis user of a run builds its client here.
    `encoding_errors` (with decode_responses): how bytes that are not UTF-8 decode (str.decode's)."""
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=socket_timeout_s,
        socket_keepalive=True,
        retry=Retry(NoBackoff(), 0),
        decode_responses=decode_responses,
        encoding_errors=encoding_errors,
    )


def retrying(
    fn: Callable[[], R],
    what: str,
    *,
    op_timeout_s: float = 30.0,
    retries: int | None = None,
    backoff_s: float = 0.05,
    max_backoff_s: float = 2.0,
) -> R:
    """Run one plain Redis call, retrying a lost connection with exponential backoff (logged), for
    at most `retries` attempts (None: no count limit) and op_timeout_s in all; then the last error
    propagates. For the run's keys outside the streams (weights pointer, feeder cursor, run state)."""
    start, delay, attempt = time.monotonic(), backoff_s, 0
    while True:
        attempt += 1
        try:
            return fn()
        except RETRYABLE_ERRORS as err:
            if isinstance(err, redis.AuthenticationError):  # a wrong password: no retry heals it
                raise
            if (retries is not None and attempt >= retries) or time.monotonic() - start + delay > op_timeout_s:
                raise
            log.warning("%s lost the connection (%s); retry %d in %.2fs", what, err, attempt, delay)
            time.sleep(delay)
            delay = min(delay * 2, max_backoff_s)
