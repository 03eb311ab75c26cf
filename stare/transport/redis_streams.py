"""Record streams on Redis streams with consumer groups: the distributed transport.

One `RedisStream` is one stream key and one consumer group. Semantics are the in-memory
stream's (`in_memory.py`), made durable:

* at-least-once: a delivered entry stays pending (in the group's PEL) until `ack`; a consumer
  that restarts under the same name first re-reads its own pending entries (XREADGROUP id "0"),
  then new ones (">"); `reclaim` hands entries idle longer than `claim_idle_ms` (a dead
  consumer's) to a live one (XAUTOCLAIM). Consumers must be idempotent: the learner skips a
  trajectory id it has seen (learner/loop/group_collector.py);
* nothing is dropped silently: an entry that fails to decode or validate (`codec.from_fields`
  raises) is written to the run's dead-letter stream with the reason, its entry id and its raw
  fields, and acknowledged, in one MULTI; so is an entry trimmed away before it was acked, and
  one delivered `max_deliveries` times without an ack (a record that keeps killing consumers);
* bounded memory: the stream holds exactly its unacknowledged entries (an acknowledgement deletes the
  entries it acknowledges; one consumer group per stream), so its backlog (pending + never delivered)
  is its length, XLEN, exact after any Redis restart (redis_backlog.py: never the group's `lag`);
  publishing is refused (or waits up to `publish_timeout_s`) while the backlog would exceed
  `max_backlog` (concurrent producers can overshoot by one batch each); XADD also trims with an
  approximate MAXLEN >= `max_backlog`, which only bites past that overshoot;
* timeouts everywhere: the client must have a socket timeout; blocking reads are capped at
  `block_ms`, below it; a ConnectionError/TimeoutError (Redis restarting, loading its AOF) is
  retried with exponential backoff, logged, for at most `retries` attempts and `op_timeout_s`.

Limits: a retried XADD that reached Redis publishes twice (consumers dedupe by record id). Not
thread-safe. Keys: `stare:{run_id}:stream:{name}`, `stare:{run_id}:dead:{name}`; docs/transport.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import redis

from stare.transport import redis_backlog as rb
from stare.transport import redis_dead_letters as dl
from stare.transport.base import Codec, Delivery, RecordStream, WireRecord
from stare.transport.redis_client import RETRYABLE_ERRORS, checked_key_part, dead_key, run_key, stream_key
from stare.transport.redis_dead_letters import TRIMMED_REASON, DeadLetter, as_str, parse_dead_letters, raw_fields

log = logging.getLogger(__name__)

T = TypeVar("T", bound=WireRecord)
R = TypeVar("R")


class BackpressureError(OverflowError):
    """Publishing would push the group's backlog past `max_backlog` (consumers are behind)."""


class RedisStream(Generic[T]):
    """One run-scoped stream with one consumer group; implements `RecordStream` plus `reclaim`.

    codec: the record class (`to_fields` on records, `from_fields` decodes and validates).
    group: the consumer group (one per role reading the stream).
    maxlen: approximate MAXLEN of every XADD (memory bound; >= max_backlog).
    max_backlog: pending + undelivered entries above which publish refuses (None: no bound).
    publish_timeout_s: how long publish waits for room before raising BackpressureError.
    block_ms: cap on a blocking consume (below the client's socket timeout).
    claim_idle_ms: default idle time after which `reclaim` takes an entry over.
    max_deliveries: a claim beyond this many deliveries dead-letters the entry (None: never).
    dead_maxlen: approximate MAXLEN of the dead-letter stream.
    op_timeout_s, retries, backoff_s, max_backoff_s: reconnect policy of one operation.
    """

    def __init__(
        self,
        client: redis.Redis,
        run_id: str,
        name: str,
        codec: Codec[T],
        *,
        group: str,
        maxlen: int = 4096,
        max_backlog: int | None = 2048,
        publish_timeout_s: float = 0.0,
        block_ms: int = 1000,
        claim_idle_ms: int = 60_000,
        max_deliveries: int | None = 5,
        dead_maxlen: int = 10_000,
        op_timeout_s: float = 30.0,
        retries: int = 10,
        backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
    ):
        socket_timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
        if socket_timeout is None:
            raise ValueError(
                "the Redis client has no socket_timeout; build it with RedisTransport.connect "
                "or redis.Redis(..., socket_timeout=5, socket_connect_timeout=5)"
            )
        if block_ms <= 0 or block_ms >= socket_timeout * 1000:
            raise ValueError(
                f"block_ms={block_ms} must be in (0, socket_timeout={socket_timeout}s): a blocking read "
                "longer than the socket timeout would time out"
            )
        if max_backlog is not None and not 1 <= max_backlog <= maxlen:
            raise ValueError(
                f"max_backlog={max_backlog} must be in [1, maxlen={maxlen}], so that MAXLEN trimming "
                "never removes an entry that was not delivered yet"
            )
        if max_deliveries is not None and max_deliveries < 2:
            raise ValueError(f"max_deliveries={max_deliveries} must be >= 2 (or None to never give up on an entry)")
        self.client, self.codec, self.group = client, codec, checked_key_part(group, "group")
        self.run_id, self.name = run_id, name
        self.key, self.dead_key = stream_key(run_id, name), dead_key(run_id, name)
        self.redelivered = 0  # entries `reclaim` took over and delivered again (a Prometheus counter)
        self.maxlen, self.max_backlog, self.publish_timeout_s = maxlen, max_backlog, publish_timeout_s
        self.block_ms, self.claim_idle_ms, self.max_deliveries = block_ms, claim_idle_ms, max_deliveries
        self.dead_maxlen, self.op_timeout_s = dead_maxlen, op_timeout_s
        self.retries, self.backoff_s, self.max_backoff_s = retries, backoff_s, max_backoff_s
        # consumer -> where its next read starts: "0"-based ids replay its own pending entries
        # (after a start or a reconnect), ">" reads new entries.
        self._cursor: dict[str, str] = {}
        # entry id -> consumer, for entries this object delivered and nobody acked yet: a replay
        # after a reconnect must not hand the caller what it already holds.
        self._inflight: dict[str, str] = {}
        self._known_backlog: int | None = None  # as seen right after this object's last publish
        self.failures_key = run_key(run_id, f"failures:{name}")  # entry id -> its last processing error
        self._failed: set[str] = set()  # ids this object recorded a failure of (cleared on ack)
        self._call("XGROUP CREATE", self._create_group)

    # ---------------------------------------------------------------- protocol
    def publish(self, records: Sequence[T]) -> list[str]:
        """Append records (one pipelined round trip); returns their entry ids. With `max_backlog`, first waits
        up to `publish_timeout_s` (0: not at all) for the group's backlog to leave room for the
        batch, else raises `BackpressureError` having written nothing."""
        return self.publish_and_ack(records, None, ())

    def publish_and_ack(self, records: Sequence[T], source: RecordStream[Any] | None, ids: Sequence[str]) -> list[str]:
        """`publish(records)`, then `source.ack(ids)` (the entries the records were made from). When
        `source` is a RedisStream on the same client, the acknowledgement rides in the same
        MULTI/EXEC: one round trip and one AOF fsync, and the records and the ack land together or
        not at all. Otherwise: publish, then ack."""
        if not records:
            if source is not None:
                source.ack(ids)
            return []
        together = source if isinstance(source, RedisStream) and source.client is self.client and ids else None
        n = len(records)
        if self.max_backlog is not None and (self._known_backlog is None or self._known_backlog + n > self.max_backlog):
            self._wait_for_room(n, self.max_backlog)
        encode = getattr(self.codec, "encode", None)  # a RecordCodec tags (record_tag.py); a record class does not
        encoded = [encode(r) for r in records] if encode is not None else [r.to_fields() for r in records]
        ack = (together, ids) if together is not None else None
        out = self._call("XADD", lambda: self._xadd_transaction(encoded, ack))
        if together is not None:
            together._acked(ids)
        elif source is not None:
            source.ack(ids)
        return out

    def consume(self, consumer: str, max_count: int, block_s: float = 0.0) -> list[Delivery[T]]:
        """Up to `max_count` records for `consumer`: first its own pending entries (once after a
        start or reconnect), then new ones, waiting up to min(block_s, block_ms) for them."""
        if max_count < 1:
            raise ValueError(f"max_count must be >= 1, got {max_count}")
        while (cursor := self._cursor.get(consumer, "0")) != ">":
            entries = self._call("XREADGROUP", lambda: self._read(consumer, cursor, max_count, None))
            if not entries:
                self._cursor[consumer] = ">"
                break
            self._cursor[consumer] = entries[-1][0]
            fresh = [(i, f) for i, f in entries if self._inflight.get(i) != consumer]
            if fresh and self.max_deliveries is not None:  # a replay (a restart, a failure) counts a delivery
                fresh = self._drop_poison(fresh, self.max_deliveries)
            if out := self._deliver(consumer, fresh):
                return out
        block_ms = min(int(block_s * 1000), self.block_ms) if block_s > 0 else None
        entries = self._call("XREADGROUP", lambda: self._read(consumer, ">", max_count, block_ms))
        return self._deliver(consumer, entries)

    def ack(self, ids: Sequence[str]) -> None:
        if not ids:
            return
        self._call("XACK", lambda: rb.ack(self.client, self.key, self.group, ids))
        self._acked(ids)

    def _acked(self, ids: Sequence[str]) -> None:
        """Bookkeeping once `ids` are acknowledged in Redis."""
        for i in ids:
            self._inflight.pop(i, None)
        if self._failed and (failed := [i for i in ids if i in self._failed]):  # failed before, done now: forget it
            self._call("HDEL", lambda: self.client.hdel(self.failures_key, *failed))
            self._failed.difference_update(failed)

    def dead_letter(self, entry_id: str, raw: object, reason: str) -> None:
        """Park an entry with its reason in the run's dead-letter stream and acknowledge it."""
        self._dead_letter_many([(entry_id, raw_fields(raw), reason)])

    def fail(self, ids: Sequence[str], error: str) -> None:
        """Processing `ids` failed with `error`: keep them pending, remember the error (in Redis, so a
        successor consumer sees it too) and deliver them again on the holder's next `consume`. The
        delivery that would exceed `max_deliveries` dead-letters an entry with its last error."""
        if not ids:
            return
        self._call("HSET", lambda: self.client.hset(self.failures_key, mapping=dict.fromkeys(ids, error[:2000])))
        self._failed.update(ids)
        for i in ids:
            if (consumer := self._inflight.pop(i, None)) is not None:
                self._cursor[consumer] = "0"  # replay this consumer's pending entries first

    def backlog(self) -> int:
        """Entries published and not yet acknowledged by this group (pending + never delivered)."""
        return self._call("XLEN", lambda: rb.backlog(self.client, self.key))

    # ---------------------------------------------------------------- beyond the protocol
    def reclaim(self, consumer: str, min_idle_ms: int | None = None, max_count: int = 1000) -> list[Delivery[T]]:
        """Take over entries pending longer than `min_idle_ms` (default `claim_idle_ms`) on any
        consumer of the group, e.g. one that died (XAUTOCLAIM), and deliver them to `consumer`.
        Entries trimmed meanwhile, and entries delivered `max_deliveries` times, are dead-lettered."""
        idle = self.claim_idle_ms if min_idle_ms is None else min_idle_ms
        claimed: list[dl.Entry] = []
        start = "0-0"
        while len(claimed) < max_count:
            count = min(100, max_count - len(claimed))
            reply = self._call(
                "XAUTOCLAIM",
                lambda: self.client.xautoclaim(self.key, self.group, consumer, idle, start_id=start, count=count),
            )
            start, entries, trimmed = as_str(reply[0]), reply[1], reply[2] if len(reply) > 2 else []
            claimed += [(as_str(i), f) for i, f in entries]
            if trimmed:
                self._dead_letter_many([(as_str(i), {}, TRIMMED_REASON) for i in trimmed])
            if start == "0-0":
                break
        # entries this object already handed to `consumer` are still being worked on: not again
        fresh = [(i, f) for i, f in claimed if self._inflight.get(i) != consumer]
        if fresh and self.max_deliveries is not None:
            fresh = self._drop_poison(fresh, self.max_deliveries)
        out = self._deliver(consumer, fresh)
        self.redelivered += len(out)
        return out

    def unacked_groups(self, exclude: frozenset[str] | set[str] = frozenset()) -> set[str]:
        """The group ids of the entries not acknowledged yet (the stream holds only those), but those of the
        entry ids in `exclude`; read from each entry's JSON header, not verified (an audit, not a delivery)."""
        return self._call("XRANGE", lambda: rb.unacked_groups(self.client, self.key, exclude))

    def dead_letter_count(self) -> int:
        """Entries in this stream's dead-letter stream (capped near `dead_maxlen`)."""
        return self._call("XLEN", lambda: self.client.xlen(self.dead_key))

    def dead_letters(self, count: int = 100) -> list[DeadLetter]:
        """The oldest `count` dead letters of this stream (for inspection and tests)."""
        reply = self._call("XRANGE", lambda: self.client.xrange(self.dead_key, count=count))
        return parse_dead_letters(dl.range_entries(reply, f"XRANGE {self.dead_key}"))

    # ---------------------------------------------------------------- internals
    def _create_group(self) -> None:
        if removed := rb.open_group(self.client, self.key, self.group):
            log.info("stream %s: removed %d entries acknowledged before", self.key, removed)

    def _wait_for_room(self, n: int, max_backlog: int) -> None:
        """Check the bound with a fresh XLEN. Called only when the backlog seen right after
        this object's last publish (an upper bound while no other producer writes, since consumers
        only shrink it) leaves no room; not atomic with the XADDs, so producers racing each other
        can overshoot `max_backlog` by at most one batch each."""
        if n > max_backlog:
            raise ValueError(
                f"publishing {n} records at once can never fit max_backlog={max_backlog} "
                f"of stream {self.key}; publish in smaller batches"
            )
        deadline, wait = time.monotonic() + self.publish_timeout_s, 0.01
        while (backlog := self._call("XLEN", lambda: rb.backlog(self.client, self.key))) + n > max_backlog:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BackpressureError(
                    f"stream {self.key}: backlog {backlog} + {n} new > max_backlog {max_backlog} (waited "
                    f"{self.publish_timeout_s}s); consumers of group {self.group!r} are behind: add consumers, "
                    "raise max_backlog, or publish with a longer publish_timeout_s"
                )
            time.sleep(min(wait, left))
            wait = min(wait * 2, 0.5)

    def _xadd_transaction(
        self, encoded: list[dict[str, bytes]], ack: tuple[RedisStream[Any], Sequence[str]] | None
    ) -> list[str]:
        # With an ack: MULTI/EXEC, outputs and ack land together or not at all, one AOF fsync with
        # `appendfsync always` (a large plain pipeline fsyncs per event-loop turn: 128 0.8 kB records
        # ~40 ms against ~8 ms as one transaction). Without one: a plain pipeline (faster unfsynced).
        pipe = self.client.pipeline(transaction=ack is not None)
        for fields in encoded:
            # redis-py types the fields as an invariant dict of EncodableT; any str -> bytes mapping is one
            pipe.xadd(self.key, fields, maxlen=self.maxlen, approximate=True)  # type: ignore[arg-type]
        if self.max_backlog is not None:
            pipe.xlen(self.key)  # the backlog after this batch, in the same round trip
        if ack is not None:
            source, ids = ack
            rb.queue_ack(pipe, source.key, source.group, ids)
        replies = pipe.execute()
        if ack is not None:
            del replies[-2:]  # XACK, XDEL
        if self.max_backlog is not None:
            self._known_backlog = int(replies.pop())
        return [as_str(i) for i in replies]

    def _read(self, consumer: str, cursor: str, count: int, block_ms: int | None) -> list[dl.Entry]:
        reply = self.client.xreadgroup(self.group, consumer, {self.key: cursor}, count=count, block=block_ms)
        if not reply:
            return []
        if not isinstance(reply, list):  # RESP3 replies a dict; connect_client's clients speak RESP2
            raise TypeError(f"XREADGROUP on {self.key}: expected a RESP2 reply (a list), got {type(reply).__name__}")
        _, entries = reply[0]
        return [(as_str(i), f) for i, f in entries]

    def _deliver(self, consumer: str, entries: list[dl.Entry]) -> list[Delivery[T]]:
        out: list[Delivery[T]] = []
        dead: list[dl.DeadItem] = []
        decode, inflight = self.codec.from_fields, self._inflight  # the per-record loop of every consume
        for entry_id, fields in entries:
            if not fields:
                dead.append((entry_id, {}, TRIMMED_REASON))
                continue
            try:
                record = decode(fields)
            except Exception as err:  # a bad record must not take the consumer down: park it with the reason
                dead.append((entry_id, fields, f"{type(err).__name__}: {err}"))
                continue
            inflight[entry_id] = consumer
            out.append(Delivery(entry_id, record))
        if dead:
            self._dead_letter_many(dead)
        return out

    def _dead_letter_many(self, items: list[dl.DeadItem]) -> None:
        self._call(
            "dead letter", lambda: dl.park(self.client, self.key, self.group, self.dead_key, self.dead_maxlen, items)
        )
        for entry_id, _, _reason in items:
            self._inflight.pop(entry_id, None)
        log.warning(
            "stream %s: %d entries dead-lettered to %s (first: %s: %s)",
            self.key,
            len(items),
            self.dead_key,
            items[0][0],
            items[0][2],
        )

    def _drop_poison(self, claimed: list[dl.Entry], max_deliveries: int) -> list[dl.Entry]:
        """Dead-letter the claimed entries delivered more than `max_deliveries` times; the rest."""
        poison = self._call(
            "XPENDING",
            lambda: dl.poisoned(self.client, self.key, self.group, self.failures_key, max_deliveries, claimed),
        )
        if not poison:
            return claimed
        ids = [i for i, _, _ in poison]
        self._dead_letter_many(poison)
        self._call("HDEL", lambda: self.client.hdel(self.failures_key, *ids))
        self._failed.difference_update(ids)
        return [(i, f) for i, f in claimed if i not in set(ids)]

    def _call(self, what: str, fn: Callable[[], R]) -> R:
        """Run one Redis operation; retry lost connections with exponential backoff (bounded) and
        recreate the group once if Redis lost it (restarted without persistence)."""
        start, attempt, regrouped = time.monotonic(), 0, False
        while True:
            try:
                result = fn()
                if attempt:
                    log.info("stream %s: %s succeeded after %d reconnect attempts", self.key, what, attempt)
                return result
            except RETRYABLE_ERRORS as err:
                if isinstance(err, redis.AuthenticationError):  # a wrong password: no retry heals it
                    raise
                attempt += 1
                elapsed = time.monotonic() - start
                delay = min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)
                if attempt > self.retries or elapsed + delay > self.op_timeout_s:
                    log.error(
                        "stream %s: %s failed after %d attempts in %.1fs: %s", self.key, what, attempt, elapsed, err
                    )
                    raise
                log.warning(
                    "stream %s: %s lost the connection (%s: %s); retry %d/%d in %.2fs",
                    self.key,
                    what,
                    type(err).__name__,
                    err,
                    attempt,
                    self.retries,
                    delay,
                )
                # a lost reply may have delivered or claimed entries: replay our pending ones next read
                self._cursor = dict.fromkeys(self._cursor, "0")
                time.sleep(delay)
            except redis.ResponseError as err:
                if regrouped or not ("NOGROUP" in str(err) or "no such key" in str(err)):
                    raise
                log.warning(
                    "stream %s: consumer group %r is gone (Redis lost its data?); recreating it", self.key, self.group
                )
                regrouped = True
                self._create_group()
