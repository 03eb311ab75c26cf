"""The stream protocol every transport implements (in-memory here, Redis streams in the system).

A stream delivers records to named consumers of one group; a delivered record stays pending until
`ack`; `dead_letter` parks a record that failed validation with its reason, so nothing is dropped
silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from stare.transport.records import PromptTask, Trajectory

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True)
class Delivery(Generic[T]):
    id: str  # the stream's id of this entry (ack with it)
    record: T


@runtime_checkable
class WireRecord(Protocol):
    """A record that encodes itself as stream fields (the instances of a `Codec`)."""

    def to_fields(self) -> dict[str, bytes]: ...


class Codec(Protocol[T_co]):
    """A wire record class: `to_fields` on instances, `from_fields` (decode + validate) on the class."""

    def from_fields(self, data: dict[bytes, bytes]) -> T_co: ...


class RecordStream(Protocol[T]):
    def publish(self, records: Sequence[T]) -> list[str]: ...

    def publish_and_ack(self, records: Sequence[T], source: RecordStream[Any] | None, ids: Sequence[str]) -> list[str]:
        """`publish(records)`, then `source.ack(ids)`: a worker's output and the acknowledgement of
        its input (on Redis one transaction when both streams share a client)."""
        ...

    def consume(self, consumer: str, max_count: int, block_s: float = 0.0) -> list[Delivery[T]]: ...

    def ack(self, ids: Sequence[str]) -> None: ...

    def dead_letter(self, entry_id: str, raw: object, reason: str) -> None: ...

    def fail(self, ids: Sequence[str], error: str) -> None:
        """Processing `ids` raised `error`: they stay pending and are delivered again; the delivery
        past the stream's max_deliveries dead-letters an entry with its last error."""
        ...

    def backlog(self) -> int:
        """Entries published and not yet acknowledged."""
        ...

    def unacked_groups(self, exclude: frozenset[str] | set[str] = frozenset()) -> set[str]:
        """The group ids of the records not acknowledged yet, but those of the entry ids in `exclude`
        (the learner's audit of published groups, learner/loop/lost_groups.py)."""
        ...

    def dead_letter_count(self) -> int:
        """Entries parked as dead letters."""
        ...

    def reclaim(self, consumer: str, min_idle_ms: int | None = None, max_count: int = 1000) -> list[Delivery[T]]:
        """Hand `consumer` the entries another consumer (a dead one) has held longer than
        `min_idle_ms` (None: the stream's default), at most `max_count`."""
        ...


class Transport(Protocol):
    """The three streams of a run."""

    @property
    def prompts(self) -> RecordStream[PromptTask]: ...

    @property
    def raw(self) -> RecordStream[Trajectory]: ...

    @property
    def scored(self) -> RecordStream[Trajectory]: ...


STREAM_NAMES = ("prompts", "raw", "scored")


def queue_depths(transport: Transport) -> dict[str, int]:
    """Each stream's entries published and not acknowledged yet (`backlog`)."""
    return {n: getattr(transport, n).backlog() for n in STREAM_NAMES}


def dead_letter_counts(transport: Transport) -> dict[str, int]:
    """Each stream's entries parked as dead letters."""
    return {n: getattr(transport, n).dead_letter_count() for n in STREAM_NAMES}
