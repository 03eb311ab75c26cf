"""The seams of the training session (learner/loop/session.py): what differs between `stare train` (in-memory
streams, in-process workers driven by `pump`) and `stare learner` (Redis streams, a weight broadcast,
workers in other processes), passed in as one `SessionSeams`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from stare.runstate import RunSteering
from stare.transport.base import Transport
from stare.transport.redis_client import retrying, run_key
from stare.weight_sync.base import WeightPublisher


class CursorStore(Protocol):
    """What must survive the learner process (Redis in the distributed mode): the feeder's published
    cursor (a restarted learner never publishes a group twice) and the newest weight version it
    published (it never publishes an older one: the workers hold it and would ignore it)."""

    def load(self) -> int: ...

    def save(self, cursor: int) -> None: ...

    def load_version(self) -> int: ...

    def save_version(self, version: int) -> None: ...


class MemoryCursor:
    def __init__(self) -> None:
        self.value, self.version = 0, 0

    def load(self) -> int:
        return self.value

    def save(self, cursor: int) -> None:
        self.value = cursor

    def load_version(self) -> int:
        return self.version

    def save_version(self, version: int) -> None:
        self.version = version


class RedisCursor:
    """The feeder's published cursor and the newest published weight version, in Redis (a `CursorStore`)."""

    def __init__(self, client, run_id: str):
        self.client, self.key = client, run_key(run_id, "feeder")

    def load(self) -> int:
        return int(retrying(lambda: self.client.hget(self.key, "cursor"), "HGET feeder cursor") or 0)

    def save(self, cursor: int) -> None:
        retrying(lambda: self.client.hset(self.key, "cursor", cursor), "HSET feeder cursor")

    def load_version(self) -> int:
        return int(retrying(lambda: self.client.hget(self.key, "weight_version"), "HGET weight version") or 0)

    def save_version(self, version: int) -> None:
        retrying(lambda: self.client.hset(self.key, "weight_version", version), "HSET weight version")


class EvaluationStopped(RuntimeError):
    """A stop was requested while an evaluation was awaited (an Evaluator that waits on other processes may
    raise it): nothing of it is logged; it stays open for the next learner to collect."""


class Evaluator(Protocol):
    def __call__(
        self, version: int, weights: Callable[[], Mapping[str, torch.Tensor]], final: bool = False
    ) -> dict[str, Any]:
        """Held-out results of the policy at `version` (`weights()` gives its state dict); `final`:
        the run's last evaluation (`task.final_eval_k` samples when set). May raise EvaluationStopped."""
        ...


@dataclass
class SessionSeams:
    transport: Transport  # prompts, raw, scored streams
    publisher: WeightPublisher  # publish, serve_joiners, close
    steering: RunSteering  # entropy changes, pause, checkpoint requests, status
    cursor: CursorStore
    evaluator: Evaluator | None
    should_stop: Callable[[], bool]
    wait: Callable[[float], None]  # sleep that a stop request cuts short
    tick: Callable[..., None] = lambda **info: None  # liveness of the main loop
    # long work (evaluation, a step, a checkpoint): alive while its thread makes progress (RoleRuntime.busy)
    busy: Callable[[str], AbstractContextManager] = lambda what: contextlib.nullcontext()
    pump: Callable[[int], None] | None = None  # in-process workers: run them once (arg: the fill round)
    # the pump's samples go through the Redis streams (the node-colocated learner, learner/process/colocation.py: reward
    # workers in other processes score them): the pull after it waits up to PULL_BLOCK_S for them, and stop,
    # pause and checkpoint requests apply at any fill round, as without a pump (nothing is held only in memory)
    pump_via_redis: bool = False
