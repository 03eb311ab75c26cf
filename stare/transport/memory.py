"""In-process streams with the semantics of the Redis ones (pending until ack, dead letters).

Single-process only (the embedded mode and unit tests); not thread-safe across processes.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Generic, Sequence, TypeVar

from stare.transport.base import Delivery

T = TypeVar("T")


class MemoryStream(Generic[T]):
    def __init__(self, name: str, maxlen: int | None = None):
        self.name = name
        self.maxlen = maxlen
        self._ids = itertools.count(1)
        self._queue: deque[tuple[str, T]] = deque()
        self._pending: OrderedDict[str, tuple[str, T]] = OrderedDict()  # id -> (consumer, record)
        self.dead: list[tuple[str, object, str]] = []
        self.redelivered = 0  # entries `reclaim` delivered again

    def publish(self, records: Sequence[T]) -> list[str]:
        if self.maxlen is not None and self.backlog() + len(records) > self.maxlen:
            raise OverflowError(f"stream {self.name} is full ({self.maxlen} entries); consume before publishing more")
        ids = [f"{next(self._ids)}-0" for _ in records]
        self._queue.extend(zip(ids, records))
        return ids

    def consume(self, consumer: str, max_count: int, block_s: float = 0.0) -> list[Delivery[T]]:
        out = []
        while self._queue and len(out) < max_count:
            entry_id, record = self._queue.popleft()
            self._pending[entry_id] = (consumer, record)
            out.append(Delivery(entry_id, record))
        return out

    def ack(self, ids: Sequence[str]) -> None:
        for entry_id in ids:
            self._pending.pop(entry_id, None)

    def dead_letter(self, entry_id: str, raw: object, reason: str) -> None:
        self.dead.append((entry_id, raw, reason))
        self.ack([entry_id])

    def reclaim(self, consumer: str, min_idle_ms: int | None = None, max_count: int = 1000) -> list[Delivery[T]]:
        """Hand pending entries to `consumer` (what XAUTOCLAIM does for a dead consumer); one
        process has no idle clock, so every pending entry counts as idle."""
        out = []
        for entry_id, (_, record) in list(self._pending.items())[:max_count]:
            self._pending[entry_id] = (consumer, record)
            out.append(Delivery(entry_id, record))
        self.redelivered += len(out)
        return out

    def dead_letter_count(self) -> int:
        return len(self.dead)

    def requeue_pending(self) -> None:
        """Make every pending entry deliverable again, as a restarted Redis consumer re-reads its
        pending entries (id 0); they count in the backlog until acknowledged."""
        self._queue.extendleft(reversed([(i, r) for i, (_, r) in self._pending.items()]))
        self._pending.clear()

    def backlog(self) -> int:
        return len(self._queue) + len(self._pending)


@dataclass
class MemoryTransport:
    prompts: MemoryStream = field(default_factory=lambda: MemoryStream("prompts"))
    raw: MemoryStream = field(default_factory=lambda: MemoryStream("raw"))
    scored: MemoryStream = field(default_factory=lambda: MemoryStream("scored"))
