"""An in-process point-to-point group with NCCL's stream semantics, over any `Streams`.

`LoopbackCommunicator` stands in for `NcclCommunicator` where both ends live in one process: the
learner's publisher and a rollout worker's subscriber of `stare doctor`'s fence check (on one GPU,
where NCCL refuses two ranks, with `CudaStreams`) and of the tests (on a CPU, with `FakeStreams`).
Everything else of the broadcast (membership, generations, layouts, buckets, buffer sets, fences)
is the real code.

Semantics, as torch's ProcessGroupNCCL gives them: each rank's group has a stream of its own; a send
or receive first makes that stream wait for the calling thread's current stream ("[Sync Streams]"),
the transfer runs on the group's streams, and `work.wait()` makes the caller's current stream wait
for it, then the host too (TORCH_NCCL_BLOCKING_WAIT=1, which stare's NCCL groups set). The transfer
is one copy on the receiver's group stream, from the sender's tensor, after the sender's stream
reached the send; the send completes with that copy. Posting a receive blocks the host until the
matching send is posted (NCCL would block in the kernel instead; the order of the work is the same).
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from stare.weight_sync.streams import Streams

Key = tuple[int, int, int, int]  # generation, source rank, destination rank, tag


@dataclass(eq=False)
class _Message:
    tensor: torch.Tensor
    ready: Any  # the sender's group stream reached the send
    done: Any = None  # the receiver's copy (set when the receive is posted)


class LoopbackFabric:
    """The mailboxes of every loopback group in the process: (generation, src, dst, tag) -> messages."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._boxes: dict[Key, deque[_Message]] = defaultdict(deque)

    def post(self, key: Key, message: _Message) -> None:
        with self._cond:
            self._boxes[key].append(message)
            self._cond.notify_all()

    def take(self, key: Key, timeout_s: float) -> _Message:
        with self._cond:
            if not self._cond.wait_for(lambda: self._boxes[key], timeout=timeout_s):
                raise RuntimeError(f"loopback receive {key}: no matching send within {timeout_s:.0f} s")
            return self._boxes[key].popleft()

    def completed(self, message: _Message, timeout_s: float) -> Any:
        """The receiver's copy event of `message` (the host waits until the receive is posted)."""
        with self._cond:
            if not self._cond.wait_for(lambda: message.done is not None, timeout=timeout_s):
                raise RuntimeError(f"loopback send: no matching receive within {timeout_s:.0f} s")
            return message.done

    def receive_posted(self, message: _Message, done: Any) -> None:
        with self._cond:
            message.done = done
            self._cond.notify_all()


class LoopbackWork:
    def __init__(self, wait_done: Callable[[], Any], streams: Streams) -> None:
        self._wait_done, self._streams = wait_done, streams

    def wait(self) -> bool:
        done = self._wait_done()
        self._streams.wait(done)  # the caller's stream waits for the transfer
        self._streams.synchronize(done)  # and the host (blocking wait)
        return True


class LoopbackGroup:
    def __init__(self, fabric: LoopbackFabric, streams: Streams, generation: int, rank: int, timeout_s: float) -> None:
        self.fabric, self.streams = fabric, streams
        self.generation, self.rank, self.timeout_s = generation, rank, timeout_s
        self.stream = streams.new_stream()  # this rank's "NCCL stream"

    def _sync_streams(self) -> None:
        self.streams.wait(self.streams.record(), self.stream)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> LoopbackWork:
        self._sync_streams()
        message = _Message(tensors[0], self.streams.record(self.stream))
        self.fabric.post((self.generation, self.rank, dst, tag), message)
        return LoopbackWork(lambda: self.fabric.completed(message, self.timeout_s), self.streams)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> LoopbackWork:
        target = tensors[0]
        self._sync_streams()
        message = self.fabric.take((self.generation, src, self.rank, tag), self.timeout_s)
        if message.tensor.numel() != target.numel() or message.tensor.dtype != target.dtype:
            raise RuntimeError(
                f"loopback receive: {list(message.tensor.shape)} {message.tensor.dtype} sent into "
                f"{list(target.shape)} {target.dtype}"
            )
        self.streams.wait(message.ready, self.stream)
        with self.streams.use(self.stream):
            self.streams.copy(target, message.tensor)
        self.streams.keep(message.tensor, self.stream)  # the sender's memory outlives the copy
        done = self.streams.record(self.stream)
        self.fabric.receive_posted(message, done)
        return LoopbackWork(lambda: done, self.streams)


class LoopbackCommunicator:
    """A `Communicator` (stare.weight_sync.communicator) whose groups are in-process loopback groups."""

    name = "loopback"

    def __init__(self, streams: Streams, fabric: LoopbackFabric | None = None) -> None:
        self.streams, self.fabric = streams, fabric or LoopbackFabric()
        self.device = streams.device

    def group(self, store: Any, generation: int, rank: int, size: int, timeout_s: float) -> LoopbackGroup:
        return LoopbackGroup(self.fabric, self.streams, generation, rank, timeout_s)
