"""The weight broadcast's test pieces: a subscriber dialling a publisher, and waiting for a join request."""

from __future__ import annotations

import time

from stare.weight_sync.broadcast import BroadcastSubscriber

TIMEOUT_S = 3.0


def subscriber(pub, name: str) -> BroadcastSubscriber:
    return BroadcastSubscriber("127.0.0.1", pub.store.port, name, timeout_s=TIMEOUT_S, poll_s=0.01)


def await_join_request(pub, n: int, timeout_s: float = 10.0) -> None:
    """Until `n` workers have asked the publisher to join."""
    deadline = time.monotonic() + timeout_s
    while pub.store.add("joins", 0) < n:
        assert time.monotonic() < deadline, "the worker never asked to join"
        time.sleep(0.01)
