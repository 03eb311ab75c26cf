"""The order of the weight sync's device work, behind a small protocol (`Streams`).

On a GPU the weight sync runs in three threads that enqueue work on different CUDA streams: the
learner trains on its stream, the publisher packs buckets and sends on a stream of its own, a rollout
worker's receiver thread receives on its stream, and the engine thread copies the received tensors
into the model on the engine's stream (vLLM makes a stream of its own current in the thread that
built it: vllm/utils/torch_utils.py `current_stream`). NCCL ops run on the group's NCCL stream after
it waits for the calling thread's current stream (torch's ProcessGroupNCCL, "[Sync Streams]"), so
which stream a thread has current decides what a send waits for. The rules this module serves:

- a publish runs on its own stream, after an event recorded where the state was handed over: the
  training stream never waits for a send, a send never waits for training work enqueued later;
- a received buffer set is read after its receive (`ready`) and received into again only after the
  engine's reads of it (`free_after`, recorded on the reader's stream), so two versions never mix.

`CudaStreams` wraps torch.cuda.Stream/Event; `HostStreams` is the CPU (gloo) case, where every copy
is synchronous and the fences are no-ops; stare.weight_sync.fake_streams.FakeStreams runs the same
calls on a CPU as a device that executes work late and in the worst order the fences allow (the
tests and `stare doctor` check the fences with it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

import torch


class Streams(Protocol):
    """Device work ordering. An event marks the work enqueued on a stream so far; `wait` makes a
    stream's later work wait for it on the device (the host does not wait)."""

    device: torch.device

    def current(self) -> Any:
        """The calling thread's current stream."""
        ...

    def new_stream(self) -> Any: ...

    def use(self, stream: Any) -> contextlib.AbstractContextManager[None]:
        """Make `stream` the calling thread's current stream for the block."""
        ...

    def record(self, stream: Any = None) -> Any:
        """An event after the work enqueued on `stream` (default: the current one) so far."""
        ...

    def wait(self, event: Any, stream: Any = None) -> None:
        """Work enqueued on `stream` (default: the current one) from now on waits for `event` (None: nothing)."""
        ...

    def synchronize(self, event: Any) -> None:
        """The host waits for `event` (a host sync)."""
        ...

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """dst <- src, enqueued on the current stream."""
        ...

    def keep(self, tensor: torch.Tensor, stream: Any = None) -> None:
        """`tensor`'s memory is not reused by the allocator before the work enqueued on `stream`
        (default: the current one) so far is done (a tensor allocated on another stream)."""
        ...


class HostStreams:
    """CPU tensors (gloo): work is done when the call returns; nothing to order."""

    device = torch.device("cpu")

    def current(self) -> None:
        return None

    def new_stream(self) -> None:
        return None

    def use(self, stream: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def record(self, stream: Any = None) -> None:
        return None

    def wait(self, event: Any, stream: Any = None) -> None:
        pass

    def synchronize(self, event: Any) -> None:
        pass

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def keep(self, tensor: torch.Tensor, stream: Any = None) -> None:
        pass


class CudaStreams:
    """torch.cuda streams and events on one device."""

    def __init__(self, device: torch.device):
        self.device = device

    def current(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def new_stream(self) -> torch.cuda.Stream:
        return torch.cuda.Stream(self.device)

    @contextlib.contextmanager
    def use(self, stream: torch.cuda.Stream) -> Iterator[None]:
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            yield

    def record(self, stream: torch.cuda.Stream | None = None) -> torch.cuda.Event:
        event: torch.cuda.Event = (stream or self.current()).record_event()
        return event

    def wait(self, event: torch.cuda.Event | None, stream: torch.cuda.Stream | None = None) -> None:
        if event is not None:
            (stream or self.current()).wait_event(event)

    def synchronize(self, event: torch.cuda.Event | None) -> None:
        if event is not None:
            event.synchronize()  # host sync

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    def keep(self, tensor: torch.Tensor, stream: torch.cuda.Stream | None = None) -> None:
        if tensor.is_cuda:
            tensor.record_stream(stream or self.current())


def streams_for(device: torch.device | None) -> Streams:
    """`CudaStreams` for a CUDA device, else `HostStreams`."""
    if device is not None and device.type == "cuda":
        return CudaStreams(device)
    return HostStreams()
