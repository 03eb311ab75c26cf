"""Processing deliveries without letting one poison entry crash-loop a worker.

`process_guarded(stream, deliveries, handle)` runs `handle(deliveries)` (which publishes and acks);
if it raises, each delivery is retried alone, so one bad entry cannot fail its batch-mates; an
entry that still raises is handed back with `stream.fail(ids, error)`: it stays pending, is
delivered again, and the stream dead-letters it with that error once it has been delivered more
than `max_deliveries` times. Backpressure (OverflowError, BackpressureError) is not a failure of
the entry: it propagates and the caller waits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from stare.transport.base import Delivery, RecordStream

log = logging.getLogger(__name__)

T = TypeVar("T")


def describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def process_guarded(
    stream: RecordStream[T], deliveries: Sequence[Delivery[T]], handle: Callable[[list[Delivery[T]]], int]
) -> int:
    """handle(deliveries) -> how many it handled; see the module docstring."""
    if not deliveries:
        return 0
    try:
        return handle(list(deliveries))
    except OverflowError:
        raise
    except Exception as err:
        if len(deliveries) == 1:
            log.warning("entry %s failed (%s); it will be delivered again", deliveries[0].id, describe(err))
            stream.fail([deliveries[0].id], describe(err))
            return 0
        log.warning("a batch of %d entries failed (%s); retrying them one by one", len(deliveries), describe(err))
    done = 0
    for d in deliveries:
        try:
            done += handle([d])
        except OverflowError:
            raise
        except Exception as err:
            log.warning("entry %s failed (%s); it will be delivered again", d.id, describe(err))
            stream.fail([d.id], describe(err))
    return done
