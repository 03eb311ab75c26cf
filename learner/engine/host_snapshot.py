"""The learner's weights copied to pinned host memory on a side CUDA stream, so that the learner's
thread does not wait for them: a `HostSnapshot` waits for its copies when first read (by the
publisher, in its own thread for a background publish), and the optimizer's next update waits for
them on the GPU (`hold_updates`). On a CPU the copies are plain clones. `PinnedStash`: the host
buffers the optimizer state waits in while a colocated engine samples, made once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from stare.weight_sync.buckets import tensor_aliases


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy owning its memory, made once: from a GPU tensor the device-to-host copy itself
    (`.cpu().clone()` copied every byte twice: 15 GB more per version at 7B), from a CPU parameter a
    clone (the state must not change when the learner steps on)."""
    return t.detach().to("cpu", copy=True)


class HostCopies:
    """Device-to-host copies into pinned memory on a side stream (CUDA only). Each source is marked
    used by that stream, so memory DeepSpeed releases right after (a gathered ZeRO-3 parameter) is
    not reused before its copy is done."""

    def __init__(self, device: torch.device):
        self.stream = _side_stream(device)
        self.stream.wait_stream(torch.cuda.current_stream(device))  # after the step that wrote the weights
        self.event: torch.cuda.Event | None = None

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cuda":
            return host_copy(t)
        with torch.cuda.stream(self.stream):
            out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
        t.record_stream(self.stream)
        return out

    def done(self) -> torch.cuda.Event:
        self.event = self.stream.record_event()
        return self.event


_SIDE_STREAMS: dict[torch.device, Any] = {}


def _side_stream(device: torch.device):
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


class HostSnapshot(Mapping):
    """The weights in pinned host memory, readable once the side stream's copies are done: the first
    read waits for them (a host sync, in the reader's thread)."""

    def __init__(self, tensors: dict[str, torch.Tensor], event):
        self._tensors, self._event = tensors, event

    def _ready(self) -> dict[str, torch.Tensor]:
        if self._event is not None:
            self._event.synchronize()  # host sync: the snapshot's copies, once
            self._event = None
        return self._tensors

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._ready()[name]

    def __iter__(self):
        return iter(self._ready())

    def __len__(self) -> int:
        return len(self._tensors)

    def meta(self) -> list[tuple[str, torch.Size, torch.dtype]]:
        """Names, shapes and dtypes without waiting for the copies (stare.weight_sync.buckets.state_meta)."""
        return [(k, v.shape, v.dtype) for k, v in self._tensors.items()]

    def aliases(self) -> dict[str, str]:
        """The tied weights (one copy under several names) without waiting for the copies
        (stare.weight_sync.buckets.state_aliases)."""
        return tensor_aliases(self._tensors)


def hold_updates(engine, event) -> None:
    """Make the optimizer's next update wait (on the GPU, not the host) for `event`: the snapshot's
    copies read the parameters the update writes. A step pre-hook on the torch optimizer, installed
    once; it waits for the newest pending event and forgets it."""
    optimizer = getattr(engine, "basic_optimizer", None) or engine.optimizer
    state = getattr(optimizer, "_stare_publish_wait", None)
    if state is None:
        state = optimizer._stare_publish_wait = {"event": None}

        def wait(*_args, **_kwargs):
            if state["event"] is not None:
                torch.cuda.current_stream().wait_event(state["event"])
                state["event"] = None

        optimizer.register_step_pre_hook(wait)
    state["event"] = event


class PinnedStash:
    """Host copies of device tensors, one buffer per key made at its first use and reused by every later
    offload (pinned on CUDA: page-locking GiBs costs seconds, and a wake must not pay it each time)."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self.buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        self.moved: list[tuple[dict[Any, Any], Any, torch.device]] = []  # (state, key, device) held here now
        self.holding = False  # between an offload and its reload (the state may be empty: before a first step)

    def put(self, key: tuple[Any, ...], state: dict[Any, Any], name: Any) -> None:
        """state[name] (a device tensor) -> its host buffer, remembered for `take_back`."""
        value = state[name]
        buffer = self.buffers.get(key)
        if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
            buffer = self.buffers[key] = torch.empty(value.shape, dtype=value.dtype, pin_memory=self.pin)
        buffer.copy_(value)  # blocking: the device memory is released right after
        self.moved.append((state, name, value.device))
        state[name] = buffer

    def take_back(self) -> None:
        """Every tensor `put` moved, back on its device: from pinned memory without a host wait (the step that
        reads it runs on the same stream, and the next `put` into a buffer is ordered after that copy)."""
        for state, name, device in self.moved:
            state[name] = state[name].to(device, non_blocking=self.pin)
        self.moved, self.holding = [], False

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())
