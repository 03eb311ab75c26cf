"""The weight sync's stream fences, exercised: the real publisher and subscriber over a loopback group.

Two scenarios on any `Streams` (stare.weight_sync.streams), used by the tests (`FakeStreams`, a CPU)
and by `stare doctor` (`CudaStreams`, one GPU):

- `back_to_back`: versions 1 and 2 published one right after the other to a worker with one receive
  buffer set (in-flight weight updates); an engine stand-in copies each version into its weights on a
  stream of its own, late (`delay`, or the fake device's adversary), and a probe on that stream takes
  what the copy of each version wrote. Mixed = a weight the copy of version v left differs from v's.
  `fenced=False` runs the same with the subscriber's fences removed: a control that shows the race
  the fences close.
- `send_while_training`: the learner hands a snapshot to the background publisher, then its stream
  goes busy (`busy`: the fake holds it, a GPU sleeps on it) before its next optimizer step; the send
  must complete meanwhile, with the snapshot's bytes.

Nothing here is a mock of the weight sync: membership, layouts, buckets, buffer sets and fences are
the product's; only the transport is the in-process loopback (stare.weight_sync.loopback).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from stare.weight_sync.background import BackgroundPublisher
from stare.weight_sync.broadcast import BroadcastPublisher
from stare.weight_sync.broadcast_recv import BroadcastSubscriber
from stare.weight_sync.buckets import Segments
from stare.weight_sync.communicator import Communicator
from stare.weight_sync.loopback import LoopbackCommunicator
from stare.weight_sync.streams import Streams

TIMEOUT_S = 20.0


class UnfencedSubscriber(BroadcastSubscriber):
    """The subscriber without its stream fences: the control of `back_to_back`."""

    @staticmethod
    def _fence_read(buffers: Segments) -> None:
        pass

    @staticmethod
    def _fence_reuse(buffers: Segments) -> None:
        pass


@dataclass
class FenceResult:
    mixed: dict[int, list[str]] = field(default_factory=dict)  # version -> weights its copy got wrong
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not any(self.mixed.values())


def weights(
    version: int, device: torch.device, shapes: dict[str, tuple[int, ...]] | None = None
) -> dict[str, torch.Tensor]:
    """A small model's weights whose every element says its version (and its position)."""
    shapes = shapes or {
        "embed.weight": (64, 32),
        "layer.0.weight": (32, 32),
        "layer.0.bias": (32,),
        "head.weight": (64, 32),
    }
    out = {}
    for i, (name, shape) in enumerate(shapes.items()):
        n = 1
        for s in shape:
            n *= s
        out[name] = (torch.arange(n, dtype=torch.float32) + 1000.0 * version + 0.25 * i).reshape(shape).to(device)
    return out


class CopyingEngine:
    """An engine stand-in: `update_weights` copies every tensor into its own weights on `stream` (after
    `delay()`, enqueued there first), then a probe copies what they hold into `seen[version]`."""

    def __init__(self, streams: Streams, names: dict[str, torch.Tensor], delay: Callable[[], None] | None = None):
        self.streams, self.delay = streams, delay
        self.stream = streams.new_stream()
        self.weights = {k: torch.zeros_like(v) for k, v in names.items()}
        self.seen: dict[int, dict[str, torch.Tensor]] = {}
        self.weight_version = 0

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        if self.delay is not None:
            self.delay()
        for name, value in state.items():
            self.streams.copy(self.weights[name], value)
        probe = self.seen[version] = {k: torch.empty_like(v) for k, v in self.weights.items()}
        for name, value in self.weights.items():
            self.streams.copy(probe[name], value)
        self.weight_version = version


def _ends(
    streams: Streams, subscriber: type[BroadcastSubscriber] = BroadcastSubscriber
) -> tuple[BackgroundPublisher, BroadcastSubscriber]:
    comm = LoopbackCommunicator(streams)

    def build(name: str, device: torch.device | None = None) -> Communicator:
        return comm  # every generation on the loopback

    pub = BroadcastPublisher(
        "127.0.0.1",
        0,
        timeout_s=TIMEOUT_S,
        communicator="gloo",
        bucket_bytes=4096,
        communicators=build,
        streams=streams,
    )
    sub = subscriber(
        "127.0.0.1",
        pub.store.port,
        "engine",
        timeout_s=TIMEOUT_S,
        poll_s=0.01,
        communicator="gloo",
        buffer_sets=1,
        communicators=build,
    )
    deadline = time.monotonic() + TIMEOUT_S
    while pub.store.add("joins", 0) < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("the weight receiver never asked to join")
        time.sleep(0.01)
    return BackgroundPublisher(pub, close_timeout_s=TIMEOUT_S), sub


def _fetched(got: tuple[int, Mapping[str, torch.Tensor]] | None) -> tuple[int, Mapping[str, torch.Tensor]]:
    if got is None:
        raise RuntimeError("the subscriber announced a version and then had none to hand out")
    return got


def back_to_back(
    streams: Streams,
    *,
    fenced: bool = True,
    delay: Callable[[], None] | None = None,
    finish: Callable[[], None] | None = None,
) -> FenceResult:
    """See the module docstring. `finish()`: run the device's remaining work (default: wait for the
    engine stream)."""
    t0 = time.perf_counter()
    device = streams.device
    learner = streams.current()  # the learner trains on the thread's stream (the default one, shared)
    v1, v2 = weights(1, device), weights(2, device)
    pub, sub = _ends(streams, BroadcastSubscriber if fenced else UnfencedSubscriber)
    engine = CopyingEngine(streams, v1, delay)
    try:
        with streams.use(learner):
            pub.publish(1, v1)
        if not sub.wait_for(1, TIMEOUT_S):
            raise RuntimeError("version 1 never arrived")
        with streams.use(engine.stream):  # the engine's thread: its copies on its stream
            version, state = _fetched(sub.fetch(0))
            engine.update_weights(state, version)
            with streams.use(learner):
                pub.publish(2, v2)  # right behind: its receive waits for the one buffer set
            if sub.fetch(1) is not None:  # the engine's next look: nothing newer yet, the set released
                raise RuntimeError("version 2 arrived before the buffer set it needs was released")
            if not sub.wait_for(2, TIMEOUT_S):
                raise RuntimeError("version 2 never arrived")
            version, state = _fetched(sub.fetch(1))
            engine.update_weights(state, version)
            done = streams.record()
        (finish or (lambda: streams.synchronize(done)))()
        if not pub.wait_idle(TIMEOUT_S):
            raise RuntimeError("the publisher did not finish")
    finally:
        sub.close()
        pub.close()
    mixed = {
        v: [k for k, t in engine.seen[v].items() if not torch.equal(t.cpu(), ref[k].cpu())]
        for v, ref in ((1, v1), (2, v2))
    }
    return FenceResult(mixed, time.perf_counter() - t0)


@dataclass
class OverlapResult:
    sent_while_busy: bool  # the send finished while the learner's stream was still busy
    bytes_ok: bool  # the receiver got the snapshot's bytes, not the next step's
    send_s: float


def send_while_training(
    streams: Streams, busy: Callable[[Any], Any], is_busy: Callable[[Any], bool], finish: Callable[[], None]
) -> OverlapResult:
    """See the module docstring. `busy(stream)` makes the stream's later work wait (returns a token),
    `is_busy(token)` says whether it still does, `finish()` lets it go and runs what is left."""
    device = streams.device
    learner = streams.current()  # the learner trains on the thread's stream (the default one, shared)
    params = weights(1, device)
    pub, sub = _ends(streams)
    try:
        with streams.use(learner):
            snapshot = {k: torch.empty_like(v) for k, v in params.items()}
            for k, v in params.items():
                streams.copy(snapshot[k], v)  # the learner's snapshot, on its stream
            pub.publish(1, snapshot)
            token = busy(learner)  # the next step takes long ...
            for v in params.values():
                streams.copy(v, v + 1.0)  # ... and then rewrites the weights
        t0 = time.perf_counter()
        sent = pub.wait_idle(TIMEOUT_S) and pub.sent_version == 1
        send_s = time.perf_counter() - t0
        overlapped = sent and is_busy(token)
        finish()
        got = sub.fetch(0) if sub.wait_for(1, TIMEOUT_S) else None
        ok = got is not None and all(torch.equal(got[1][k].cpu(), weights(1, device)[k].cpu()) for k in params)
        with streams.use(learner):
            streams.synchronize(streams.record())
    finally:
        sub.close()
        pub.close()
    return OverlapResult(overlapped, ok, send_s)
