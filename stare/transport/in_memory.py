"""In-process streams with the semantics of the Redis ones (pending until ack, dead letters).

Single-process only (the embedded mode and unit tests); not thread-safe across processes.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from stare.transport.base import Delivery, RecordStream

if TYPE_CHECKING:
    from stare.transport.records import PromptTask, Trajectory

T = TypeVar("T")


class MemoryStream(Generic[T]):
    """max_deliveries: as the Redis stream's; an entry delivered more often without an ack (each
    `fail`, `reclaim` or `requeue_pending` delivers it again) is dead-lettered with its last error."""

    def __init__(self, name: str, maxlen: int | None = None, max_deliveries: int | None = 5):
        if max_deliveries is not None and max_deliveries < 2:
            raise ValueError(f"max_deliveries={max_deliveries} must be >= 2 (or None to never give up on an entry)")
        self.name = name
        self.maxlen, self.max_deliveries = maxlen, max_deliveries
        self._ids = itertools.count(1)
        self._queue: deque[tuple[str, T]] = deque()
        self._pending: OrderedDict[str, tuple[str, T]] = OrderedDict()  # id -> (consumer, record)
        self._deliveries: dict[str, int] = {}  # id -> times delivered, until acked
        self._errors: dict[str, str] = {}  # id -> last processing error, until acked
        self.dead: list[tuple[str, object, str]] = []
        self.redelivered = 0  # entries `reclaim` delivered again

    def publish(self, records: Sequence[T]) -> list[str]:
        if self.maxlen is not None and self.backlog() + len(records) > self.maxlen:
            raise OverflowError(f"stream {self.name} is full ({self.maxlen} entries); consume before publishing more")
        ids = [f"{next(self._ids)}-0" for _ in records]
        self._queue.extend(zip(ids, records))
        return ids

    def publish_and_ack(self, records: Sequence[T], source: RecordStream[Any] | None, ids: Sequence[str]) -> list[str]:
        out = self.publish(records)
        if source is not None:
            source.ack(ids)
        return out

    def consume(self, consumer: str, max_count: int, block_s: float = 0.0) -> list[Delivery[T]]:
        out: list[Delivery[T]] = []
        while self._queue and len(out) < max_count:
            entry_id, record = self._queue.popleft()
            self._pending[entry_id] = (consumer, record)
            if self._count_delivery(entry_id, record):
                out.append(Delivery(entry_id, record))
        return out

    def ack(self, ids: Sequence[str]) -> None:
        for entry_id in ids:
            self._pending.pop(entry_id, None)
            self._deliveries.pop(entry_id, None)
            self._errors.pop(entry_id, None)

    def dead_letter(self, entry_id: str, raw: object, reason: str) -> None:
        self.dead.append((entry_id, raw, reason))
        self.ack([entry_id])

    def fail(self, ids: Sequence[str], error: str) -> None:
        """Processing `ids` failed with `error`: they are delivered again first (the Redis stream's
        replay of a consumer's pending entries); past max_deliveries, dead-lettered with the error."""
        for entry_id in reversed(list(ids)):
            if entry_id in self._pending:
                self._errors[entry_id] = error
                _, record = self._pending.pop(entry_id)
                self._queue.appendleft((entry_id, record))

    def reclaim(self, consumer: str, min_idle_ms: int | None = None, max_count: int = 1000) -> list[Delivery[T]]:
        """Hand pending entries to `consumer` (what XAUTOCLAIM does for a dead consumer); one
        process has no idle clock, so every pending entry counts as idle."""
        out: list[Delivery[T]] = []
        for entry_id, (_, record) in list(self._pending.items())[:max_count]:
            self._pending[entry_id] = (consumer, record)
            if self._count_delivery(entry_id, record):
                out.append(Delivery(entry_id, record))
        self.redelivered += len(out)
        return out

    def dead_letter_count(self) -> int:
        return len(self.dead)

    def _count_delivery(self, entry_id: str, record: T) -> bool:
        """Count one delivery; False (and dead-lettered) when it is one more than max_deliveries."""
        n = self._deliveries[entry_id] = self._deliveries.get(entry_id, 0) + 1
        if self.max_deliveries is None or n <= self.max_deliveries:
            return True
        error = self._errors.get(entry_id)
        self.dead_letter(
            entry_id,
            record,
            f"delivered {n - 1} times without an ack (max_deliveries="
            f"{self.max_deliveries}); "
            + (f"last error: {error}" if error is not None else "its consumer died or stalled on it each time"),
        )
        return False

    def requeue_pending(self) -> None:
        """Make every pending entry deliverable again, as a restarted Redis consumer re-reads its
        pending entries (id 0); they count in the backlog until acknowledged."""
        self._queue.extendleft(reversed([(i, r) for i, (_, r) in self._pending.items()]))
        self._pending.clear()

    def backlog(self) -> int:
        return len(self._queue) + len(self._pending)

    def unacked_groups(self, exclude: frozenset[str] | set[str] = frozenset()) -> set[str]:
        """The group ids of the records not acknowledged yet, but those of the entry ids in `exclude`."""
        entries = [*self._queue, *((i, r) for i, (_, r) in self._pending.items())]
        return {g for i, r in entries if i not in exclude and (g := getattr(r, "group_id", None)) is not None}


@dataclass
class MemoryTransport:
    prompts: MemoryStream[PromptTask] = field(default_factory=lambda: MemoryStream("prompts"))
    raw: MemoryStream[Trajectory] = field(default_factory=lambda: MemoryStream("raw"))
    scored: MemoryStream[Trajectory] = field(default_factory=lambda: MemoryStream("scored"))
