"""Publishing weights without waiting for the sync (`system.max_staleness >= 1`).

`BackgroundPublisher` wraps any `WeightPublisher`: `publish(version, state)` hands the state to one
sender thread and returns. Bounded: at most one version is being sent and one waits; a newer
`publish` replaces the waiting one (it is never sent: counted in `superseded`), so versions go out
in increasing order and at most two states are referenced. `serve_joiners` runs only while nothing
is being sent (else the joiners are served by the next call or the next publish).

The state is iterated in the sender thread while the learner trains the next step, so it must not
change under it: the learners' `state_dict_for_rollout()` returns a snapshot when max_staleness >= 1
(a device copy, or pinned host memory filled on a side stream: its first read, here in the sender
thread, waits for the copies; the learner's thread does not). On a GPU the hand-over is an event
recorded on the learner's stream (`ReadyState.ready`): the sender's device work waits for it on a
stream of its own (stare.weight_sync.broadcast), so the learner's later steps never wait for a send
and a send never waits for them (stare.weight_sync.streams). A lazy mapping
whose iteration runs collectives with other ranks (ZeRO-3 gathering) must not be published in the
background: build the publisher with `background=False` (stare.weight_sync.factory).

An error in the sender thread (not a worker's failure: those are handled inside the publisher) is
raised again by the next `publish`, `serve_joiners` or `close`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, ItemsView, Iterator, Mapping
from typing import Any

import torch

from stare.weight_sync.base import WeightPublisher
from stare.weight_sync.streams import HostStreams, Streams

log = logging.getLogger(__name__)


class BackgroundPublisher:
    def __init__(self, inner: WeightPublisher, *, close_timeout_s: float = 300.0):
        self.inner, self.close_timeout_s = inner, close_timeout_s
        self.streams: Streams = getattr(inner, "streams", None) or HostStreams()
        self._cond = threading.Condition()
        self._waiting: tuple[int, Mapping[str, torch.Tensor]] | None = None
        self._sending: int | None = None  # the version being sent
        self._send_lock = threading.Lock()  # held while the inner publisher sends (publish or serve_joiners)
        self._error: BaseException | None = None
        self._closing = False
        self.version = -1  # the newest version handed over
        self.sent_version = -1  # the newest version the inner publisher finished
        self.superseded = 0
        self.last_sync_s: float | None = None  # wall time of the last finished background publish
        self._thread = threading.Thread(target=self._run, name="weights-publisher", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ WeightPublisher
    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        self._raise_error()
        ready = self.streams.record()  # on the learner's stream: after the work that made the state
        if ready is not None:
            state_dict = ReadyState(state_dict, ready)
        with self._cond:
            if version <= self.version:
                raise ValueError(f"weight version must increase: got {version} after {self.version}")
            if self._waiting is not None:
                self.superseded += 1
                log.info("weight version %d superseded by %d before it was sent", self._waiting[0], version)
            self._waiting = (version, state_dict)
            self.version = version
            self._cond.notify_all()

    def serve_joiners(self, version: int, state_fn: Callable[[], Mapping[str, torch.Tensor]]) -> bool:
        self._raise_error()
        with self._cond:
            if self._waiting is not None:
                return False  # a publish is about to admit them anyway
        if not self._send_lock.acquire(blocking=False):
            return False
        try:
            return self.inner.serve_joiners(version, state_fn)
        finally:
            self._send_lock.release()

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until every handed-over version was sent (True) or timeout_s passed (False)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._waiting is None and self._sending is None or self._error is not None, timeout=timeout_s
            )

    def close(self) -> None:
        """Send what waits (bounded by close_timeout_s), stop the thread, close the inner publisher."""
        idle = self.wait_idle(self.close_timeout_s)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=self.close_timeout_s if idle else 1.0)
        self.inner.close()
        if not idle:
            log.warning("weight publisher closed with version %s still being sent", self._sending)
        self._raise_error()

    # ------------------------------------------------------------ proxies read by the session
    @property
    def failures(self) -> int:
        return getattr(self.inner, "failures", 0)

    @property
    def alive_members(self) -> list[str]:
        return getattr(self.inner, "alive_members", [])

    # ------------------------------------------------------------ sender thread
    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._waiting is not None or self._closing)
                if self._waiting is None:
                    return
                (version, state), self._waiting = self._waiting, None
                self._sending = version
            try:
                with self._send_lock:
                    t0 = time.perf_counter()
                    self.inner.publish(version, state)
                    self.last_sync_s = time.perf_counter() - t0
                del state
            except BaseException as err:
                log.error("publishing weight version %d failed: %s", version, err)
                with self._cond:
                    self._error = err
            with self._cond:
                self._sending = None
                if self._error is None:
                    self.sent_version = version
                self._cond.notify_all()
            if self._error is not None:
                return

    def _raise_error(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"the background weight publisher failed: {err}") from err


class ReadyState(Mapping[str, torch.Tensor]):
    """A state handed to the sender thread with `ready`, the event after the learner's work that made it
    (stare.weight_sync.broadcast waits for it on its publish stream). Everything else is the state's own
    (a lazy mapping's `meta` and `aliases`, its one pass of `items`)."""

    def __init__(self, state: Mapping[str, torch.Tensor], ready: object) -> None:
        self._state, self.ready = state, ready

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._state[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)

    def items(self) -> ItemsView[str, torch.Tensor]:
        return self._state.items()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._state, name)
