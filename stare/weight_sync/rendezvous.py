"""Where a run's weight broadcast is, and whose it is: the learner announces it in Redis, rollout workers
find it there.

Each start of a learner is a new **epoch** of the run (`stare:<run>:weights:epoch`, incremented once
per start). Its publisher binds its TCPStore (any free port when `system.broadcast_port` is 0), writes
its run id and epoch into the store, and announces host, port, epoch and run in
`stare:<run>:weights:rendezvous`. A worker dials what is announced, not what its config says, and joins
a store only if the store says it is that run's announced epoch. So:

* a restarted learner on another port (or another host) is found at once;
* a store of another run, or of a dead learner whose port another process took, is never joined (its
  run or epoch differs): the worker says so and waits for its own learner;
* a worker's epochs only increase: a newer announcement makes it leave the generation it is in (a dead
  or stopped learner's group is abandoned, not waited out), and it never joins an older epoch again.

Without Redis (tests, a fixed address) a worker dials its configured address and checks nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stare.transport.redis_client import retrying, run_key

log = logging.getLogger(__name__)

RUN_KEY, EPOCH_KEY = "run", "epoch"  # what a learner's TCPStore says about itself


@dataclass(frozen=True)
class Rendezvous:
    host: str  # what workers dial (system.broadcast_host)
    port: int  # the port the store is bound to
    epoch: int  # the learner start that bound it
    run: str


Locate = Callable[[], "Rendezvous | None"]


class RedisRendezvous:
    """A run's epoch counter and announcement, in its Redis (`client`: a role's redis.Redis)."""

    def __init__(self, client: Any, run_id: str):
        self.client, self.run = client, run_id
        self.epoch_key, self.key = run_key(run_id, "weights:epoch"), run_key(run_id, "weights:rendezvous")

    def new_epoch(self) -> int:
        """The next epoch of this run (atomic: two learner starts never share one)."""
        return int(retrying(lambda: self.client.incr(self.epoch_key), "INCR weight epoch"))

    def announce(self, rendezvous: Rendezvous) -> None:
        mapping = {"host": rendezvous.host, "port": rendezvous.port, "epoch": rendezvous.epoch, "run": rendezvous.run}
        retrying(lambda: self.client.hset(self.key, mapping=mapping), "HSET weight rendezvous")
        log.info(
            "weight broadcast of %s epoch %d at %s:%d",
            rendezvous.run,
            rendezvous.epoch,
            rendezvous.host,
            rendezvous.port,
        )

    def current(self) -> Rendezvous | None:
        """The announced rendezvous; None before any learner announced one (or while Redis is away)."""
        try:
            raw = retrying(lambda: self.client.hgetall(self.key), "HGETALL weight rendezvous", op_timeout_s=5.0)
        except Exception as err:
            log.info("weight rendezvous not readable yet: %s", err)
            return None
        if not raw:
            return None
        f = {
            k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v for k, v in raw.items()
        }
        return Rendezvous(f["host"], int(f["port"]), int(f["epoch"]), f["run"])


def store_identity(store: Any) -> tuple[str, int] | None:
    """(run, epoch) a learner's TCPStore says it serves; None if it says nothing (not a stare learner's
    store, or one that has not written them yet)."""
    if not store.check([RUN_KEY, EPOCH_KEY]):
        return None
    return store.get(RUN_KEY).decode(), int(store.get(EPOCH_KEY))
