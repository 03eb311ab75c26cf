"""`TimedStream`: the in-memory stream of `stare sim` whose entries become visible at their producer's
virtual time (the real `MemoryStream` inside)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from stare.transport.in_memory import MemoryStream


class TimedStream:
    """A `MemoryStream` whose entries become visible at their producer's virtual time. `max_backlog`: the
    product's bound on unacknowledged entries (`stare.runtime.process.stream_backlog`); a publish past it is
    refused with the Redis stream's `BackpressureError`, having written nothing."""

    def __init__(self, name: str, clock: Callable[[], float], max_backlog: int | None = None):
        self.inner, self.clock, self.name = MemoryStream(name, max_deliveries=None), clock, name
        self.max_backlog = max_backlog
        self.before_consume: Callable[[], None] | None = None  # a colocated rank's thread waits for its turn
        self.future: list[tuple[float, int, Any]] = []
        self._seq = itertools.count()

    @property
    def dead(self):
        return self.inner.dead

    def publish(self, records) -> list[str]:
        if self.max_backlog is not None and self.backlog() + len(records) > self.max_backlog:
            from stare.transport.redis_streams import BackpressureError

            raise BackpressureError(
                f"stream {self.name}: backlog {self.backlog()} + {len(records)} new > max_backlog {self.max_backlog}"
            )
        t = self.clock()
        for r in records:
            heapq.heappush(self.future, (t, next(self._seq), r))
        return []

    def publish_and_ack(self, records, source, ids) -> list[str]:
        self.publish(records)
        if source is not None:
            source.ack(ids)
        return []

    def release(self, t: float) -> int:
        out = []
        while self.future and self.future[0][0] <= t + 1e-12:
            out.append(heapq.heappop(self.future)[2])
        if out:
            self.inner.publish(out)
        return len(out)

    def next_time(self) -> float | None:
        return self.future[0][0] if self.future else None

    def visible(self) -> int:
        return len(self.inner._queue)

    def consume(self, consumer: str, max_count: int, block_s: float = 0.0):
        if self.before_consume is not None:
            self.before_consume()
        return self.inner.consume(consumer, max_count, block_s)

    def ack(self, ids) -> None:
        self.inner.ack(ids)

    def dead_letter(self, entry_id, raw, reason) -> None:
        self.inner.dead_letter(entry_id, raw, reason)

    def fail(self, ids, error) -> None:
        self.inner.fail(ids, error)

    def backlog(self) -> int:
        return self.inner.backlog() + len(self.future)

    def dead_letter_count(self) -> int:
        return self.inner.dead_letter_count()

    def reclaim(self, consumer, min_idle_ms=None, max_count=1000):
        return []
