"""A device on the CPU that runs stream work late and in the worst order the fences allow (`FakeStreams`).

The `Streams` protocol (stare.weight_sync.streams) with CUDA's semantics and a lazy adversary: work
enqueued on a stream runs only when the host waits for an event (`synchronize`, a blocking receive)
or drains a stream, and then only the work that event depends on: its stream's work up to it, in
order, and, for each `wait` on the way, the work of the event waited for. Everything else waits.
So a copy that nothing orders before a later write runs after it and reads what the write left:
the race a GPU may or may not show, every time. Threads have their own current stream; a thread that
never chose one shares `default` (CUDA's legacy default stream, which the learner trains on).

`hold(stream)` stops a stream's work enqueued from then on (a training step that takes long, a
send that does not finish), so a test can show that some other work never waits for it. `log` lists
the labels of the work done, in order. Used by the tests and by `stare doctor` on a CPU.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


class Stuck(RuntimeError):
    """The host waits for work that cannot run (held, or in a circular wait) for `stall_s`."""


@dataclass(eq=False)
class FakeStream:
    name: str
    ops: deque[_Op] = field(default_factory=deque)
    enqueued: int = 0  # ops enqueued so far
    ran: int = 0  # ops run so far
    held_from: int | None = None  # ops from this index on do not run


@dataclass(eq=False)
class FakeEvent:
    """Done once `stream` has run its first `index` ops."""

    stream: FakeStream
    index: int

    @property
    def done(self) -> bool:
        return self.stream.ran >= self.index

    @property
    def label(self) -> str:
        return f"{self.stream.name}@{self.index}"


@dataclass(eq=False)
class _Op:
    label: str
    fn: Callable[[], Any] | None = None
    waits_on: FakeEvent | None = None


class FakeStreams:
    """See the module docstring. `stall_s`: how long a host wait may find nothing to run before `Stuck`."""

    device = torch.device("cpu")

    def __init__(self, stall_s: float = 5.0):
        self.stall_s = stall_s
        self._cond = threading.Condition(threading.RLock())
        self._streams: list[FakeStream] = []
        self._local = threading.local()
        self.default = self.new_stream("default")
        self.log: list[str] = []  # the labels of the work run, in order
        self.waiting = 0  # host waits in progress (threads blocked in `synchronize` or `drain`)

    # ------------------------------------------------------------------ Streams
    def current(self) -> FakeStream:
        return getattr(self._local, "stream", self.default)

    def new_stream(self, name: str | None = None) -> FakeStream:
        with self._cond:
            stream = FakeStream(name or f"stream{len(self._streams)}")
            self._streams.append(stream)
            return stream

    @contextlib.contextmanager
    def use(self, stream: FakeStream) -> Iterator[None]:
        before = self.current()
        self._local.stream = stream
        try:
            yield
        finally:
            self._local.stream = before

    def record(self, stream: FakeStream | None = None) -> FakeEvent:
        stream = stream or self.current()
        with self._cond:
            return FakeEvent(stream, stream.enqueued)

    def wait(self, event: FakeEvent | None, stream: FakeStream | None = None) -> None:
        if event is not None:
            stream = stream or self.current()
            self._enqueue(stream, _Op(f"{stream.name} waits for {event.label}", waits_on=event))

    def synchronize(self, event: FakeEvent | None) -> None:
        if event is not None:
            self._run(lambda: self._advance(event.stream, event.index), f"event {event.label}")

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.enqueue(lambda: dst.copy_(src), "copy")

    def keep(self, tensor: torch.Tensor, stream: Any = None) -> None:
        pass  # this device never reuses memory

    # ------------------------------------------------------------------ the fake's own controls
    def enqueue(self, fn: Callable[[], Any], label: str, stream: FakeStream | None = None) -> None:
        """Any work (`fn` runs when the device gets to it), on `stream` (default: the current one)."""
        stream = stream or self.current()
        self._enqueue(stream, _Op(f"{stream.name}: {label}", fn=fn))

    def hold(self, stream: FakeStream) -> None:
        """Work enqueued on `stream` from now on does not run until `release`."""
        with self._cond:
            stream.held_from = stream.enqueued

    def release(self, stream: FakeStream) -> None:
        with self._cond:
            stream.held_from = None
            self._cond.notify_all()

    def release_all(self) -> None:
        for stream in list(self._streams):
            self.release(stream)

    def drain(self, streams: list[FakeStream] | None = None) -> None:
        """Run all the work of `streams` (default: every stream) that is not held; Stuck if some cannot."""
        targets = list(streams or self._streams)
        self._run(
            lambda: all(self._advance(s, s.enqueued if s.held_from is None else s.held_from) for s in targets),
            "the streams " + ", ".join(s.name for s in targets),
        )

    def pending(self) -> dict[str, int]:
        """Work not run yet, per stream."""
        with self._cond:
            return {s.name: len(s.ops) for s in self._streams if s.ops}

    # ------------------------------------------------------------------ internals
    def _enqueue(self, stream: FakeStream, op: _Op) -> None:
        with self._cond:
            stream.ops.append(op)
            stream.enqueued += 1
            self._cond.notify_all()

    def _advance(self, stream: FakeStream, upto: int, waiting: frozenset[FakeStream] = frozenset()) -> bool:
        """Run `stream`'s work up to its `upto`-th op and what that work waits for; False if blocked."""
        while stream.ran < upto:
            if stream.held_from is not None and stream.ran >= stream.held_from:
                return False
            if not stream.ops:
                return False  # not enqueued yet (another thread's host is about to)
            op = stream.ops[0]
            event = op.waits_on
            if event is not None and not event.done:
                if stream in waiting:
                    raise Stuck(f"circular wait through {stream.name}")
                if not self._advance(event.stream, event.index, waiting | {stream}):
                    return False
                continue
            stream.ops.popleft()
            stream.ran += 1
            if op.fn is not None:
                op.fn()
            self.log.append(op.label)
            self._cond.notify_all()
        return True

    def _run(self, reached: Callable[[], bool], what: str) -> None:
        """Advance until `reached()`; Stuck after `stall_s` in which no thread ran anything."""
        with self._cond:
            last, seen = time.monotonic(), len(self.log)
            self.waiting += 1
            try:
                while not reached():
                    if len(self.log) != seen:
                        last, seen = time.monotonic(), len(self.log)
                    elif time.monotonic() - last > self.stall_s:
                        raise Stuck(
                            f"waiting for {what}: nothing can run for {self.stall_s:.1f} s; pending {self.pending()}"
                        )
                    self._cond.wait(0.01)  # another thread may enqueue, release or run what is missing
            finally:
                self.waiting -= 1
