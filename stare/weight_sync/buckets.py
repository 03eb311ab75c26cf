"""The weight broadcast's wire format: a state dict as fixed-size byte messages (pure, no I/O).

A version's `Layout` is planned before any byte is sent, from the names, shapes and dtypes alone
(`state_meta`: a lazy mapping gives them without materialising its tensors): where each tensor goes
(segment, offset), each segment's size, and so every message (segment, start, n). The sender stores
the layout in the rendezvous store (only when it changed) and receivers derive the same message list
from it, so no message carries a header: a receiver posts every receive of a version before it waits
for any, and reads nothing back from a received tensor. (Per-message int64 headers read with
`.tolist()` cost one host sync per message on the receiving GPU, ~315 per version at 7B.)

Sender (`BucketPacker.messages`): iterates `state.items()` exactly once, in order, never indexing
by name, so a lazy mapping (tensors produced one at a time) is never held whole; each item must
match its planned entry. Small tensors (at most PACK_MAX_BYTES, or the bucket size if smaller:
norms, biases) are copied into a flat uint8 bucket of `bucket_bytes` (offsets aligned to ALIGN
bytes) that is sent when its segment is complete; a larger tensor is a segment of its own, sent from
its own memory (no copy) in `bucket_bytes` chunks, so no message exceeds `bucket_bytes` and only the
small tensors are copied. Two buckets alternate: the caller must have awaited message k-1's sends
before it pulls message k+1 (the bucket of k-1 is then rewritten). So the next item of the state is
taken while the previous tensor's sends may still run: a lazy mapping must not rewrite item i's
memory for item i+1 (fresh tensors per item are fine). Empty tensors travel in the layout only.

Tied weights (one storage under several names, e.g. `lm_head.weight` and
`model.embed_tokens.weight` with tied embeddings: 0.47 GB of bf16 for Qwen2.5-Math-1.5B) travel
once: `state_aliases` finds them (same storage, offset, shape, stride and dtype; a lazy mapping says
them through `aliases()`), the layout gives a later name the (segment, offset) of its first one, and
the sender skips every entry whose bytes it already placed. So two non-empty entries share a
(segment, offset) exactly when they are one tensor, and the receiver's views of the two names are
views of the same bytes: the alias is restored and every name arrives.

Receiver (`Segments`): one contiguous uint8 buffer per segment, reused across versions with the same
segment sizes; every tensor is a view into one segment (bit-identical, no copy).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from stare.weight_sync.streams import HostStreams, Streams

ALIGN = 64  # bytes: any dtype can view a packed tensor at an aligned offset
PACK_MAX_BYTES = 2**20  # larger tensors are sent from their own memory
EMPTY = -1  # the segment of an empty tensor: it has no bytes on the wire
DTYPES = {
    str(d): d
    for d in (
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}

Meta = tuple[str, list[int], str]  # name, shape, dtype
LayoutEntry = tuple[str, list[int], str, int, int]  # name, shape, dtype, segment, offset


@dataclass
class Message:
    segment: int
    start: int  # byte offset in the segment
    payload: torch.Tensor  # uint8 [n]: a bucket slice or a chunk of one big tensor


@dataclass(frozen=True)
class Layout:
    """Where every tensor of a version lies, and so every message the version takes."""

    entries: list[LayoutEntry]
    segments: list[int]  # bytes per segment
    bucket_bytes: int

    def messages(self) -> list[tuple[int, int, int]]:  # (segment, start, n), in the order they are sent
        b = self.bucket_bytes
        return [(s, start, min(b, size - start)) for s, size in enumerate(self.segments) for start in range(0, size, b)]

    def to_json(self) -> dict[str, Any]:
        return {"entries": self.entries, "segments": self.segments, "bucket_bytes": self.bucket_bytes}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Layout:
        return cls([tuple(e) for e in data["entries"]], list(data["segments"]), int(data["bucket_bytes"]))


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _nbytes(shape: list[int], dtype: str) -> int:
    return DTYPES[dtype].itemsize * _numel(shape)


def state_meta(state: Mapping[str, torch.Tensor]) -> list[Meta]:
    """(name, shape, dtype) of every tensor, in iteration order, without materialising anything: a
    lazy mapping says it through `meta()`; for a plain mapping the tensors are there already."""
    meta = getattr(state, "meta", None)
    if meta is not None:
        return [(name, list(shape), str(dtype)) for name, shape, dtype in meta()]
    return [(name, list(value.shape), str(value.dtype)) for name, value in state.items()]


def tensor_aliases(tensors: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """name -> the first earlier name that is the same tensor (tied weights): same storage, offset,
    shape, stride and dtype. Reads no tensor's data (a pending device-to-host copy is not waited for)."""
    first: dict[tuple[object, ...], str] = {}
    aliases = {}
    for name, t in tensors.items():
        if t.numel() == 0 or t.device.type == "meta":  # a meta tensor has no storage to share
            continue
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
    return aliases


def state_aliases(state: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """The tied weights of `state` (`tensor_aliases`). A lazy mapping (one with `meta()`) is not
    iterated for them: it says them through `aliases()`, and without one every name is sent."""
    aliases = getattr(state, "aliases", None)
    if aliases is not None:
        named: dict[str, str] = aliases()  # a lazy mapping's own method (no protocol: a plain mapping has none)
        return named
    return {} if hasattr(state, "meta") else tensor_aliases(state)


def plan_layout(
    meta: list[Meta], bucket_bytes: int, pack_bytes: int, aliases: Mapping[str, str] | None = None
) -> Layout:
    """The layout of a version (pure). A tensor larger than `pack_bytes` closes the open bucket and
    takes a segment of its own, so segments are in iteration order and the sender never goes back.
    `aliases` (name -> an earlier name with the same shape and dtype): the name gets its original's
    place and no bytes of its own."""
    entries: list[LayoutEntry] = []
    segments: list[int] = []
    placed: dict[str, LayoutEntry] = {}
    fill = None  # the open packed segment's fill (None: none open)
    for name, shape, dtype in meta:
        if dtype not in DTYPES:
            raise TypeError(f"weight {name}: dtype {dtype} cannot be broadcast (supported: {sorted(DTYPES)})")
        n = _nbytes(shape, dtype)
        original = placed.get((aliases or {}).get(name, ""))
        if original is not None and n > 0:
            if (original[1], original[2]) != (shape, dtype):
                raise ValueError(
                    f"weight {name} {shape} {dtype} is tied to {original[0]} {original[1]} {original[2]}: "
                    "an alias must have its original's shape and dtype"
                )
            entries.append((name, shape, dtype, original[3], original[4]))
            continue
        if n == 0:
            entries.append((name, shape, dtype, EMPTY, 0))
        elif n > pack_bytes:
            fill = None
            segments.append(n)
            entries.append((name, shape, dtype, len(segments) - 1, 0))
        else:
            if fill is None or _aligned(fill) + n > bucket_bytes:
                segments.append(0)
                fill = 0
            offset = _aligned(fill)
            entries.append((name, shape, dtype, len(segments) - 1, offset))
            fill = segments[-1] = offset + n
        placed[name] = entries[-1]
    return Layout(entries, segments, bucket_bytes)


def as_bytes(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 [nbytes] view of `t` on `device` (copied only if elsewhere or not contiguous)."""
    t = t.detach()
    if t.device != device:
        t = t.to(device)
    return t.contiguous().reshape(-1).view(torch.uint8)


class BucketPacker:
    """Sender side; holds two flat buckets of `bucket_bytes` on `device`, reused across versions. Device
    work goes through `streams`, on the calling thread's current stream (the publish stream): the bucket
    copies, and each tensor of the state marked used there (`keep`: a snapshot allocated on the training
    stream is not reused before the publish stream has read it)."""

    def __init__(self, bucket_bytes: int, device: torch.device, streams: Streams | None = None) -> None:
        if bucket_bytes < ALIGN:
            raise ValueError(f"bucket size {bucket_bytes} bytes is below {ALIGN}: raise system.weight_sync_bucket_mb")
        self.bucket_bytes, self.device = bucket_bytes, device
        self.streams: Streams = streams or HostStreams()
        self.pack_bytes = min(bucket_bytes, PACK_MAX_BYTES)
        self._buckets: list[torch.Tensor] = []

    def _bucket(self, k: int) -> torch.Tensor:
        while len(self._buckets) <= k % 2:
            self._buckets.append(torch.empty(self.bucket_bytes, dtype=torch.uint8, device=self.device))
        return self._buckets[k % 2]

    def layout(self, state: Mapping[str, torch.Tensor]) -> Layout:
        return plan_layout(state_meta(state), self.bucket_bytes, self.pack_bytes, state_aliases(state))

    def messages(self, state: Mapping[str, torch.Tensor], layout: Layout) -> Iterator[Message]:
        """The messages of one version, exactly `layout.messages()`, from one pass over `state`."""
        planned = iter(layout.entries)
        open_seg, bucket, sent = EMPTY, None, 0  # the packed segment being filled, its bucket; messages so far
        placed: set[tuple[int, int]] = set()  # (segment, offset) of every tensor sent: a tied name's is skipped
        for name, value in state.items():  # the one pass
            entry = next(planned, None)
            if entry is None or (entry[0], entry[1], entry[2]) != (name, list(value.shape), str(value.dtype)):
                raise ValueError(
                    f"weight {name} {list(value.shape)} {value.dtype} is not the planned {entry}: the state "
                    "changed between its layout and its pass"
                )
            _, shape, dtype, segment, offset = entry
            if segment == EMPTY or (segment, offset) in placed:
                continue
            placed.add((segment, offset))
            data = as_bytes(value, self.device)
            self.streams.keep(data)
            if segment != open_seg and bucket is not None:  # the open bucket is complete
                yield Message(open_seg, 0, bucket[: layout.segments[open_seg]])
                sent, bucket, open_seg = sent + 1, None, EMPTY
            n = data.numel()
            if n > self.pack_bytes:  # a segment of its own, sent from the tensor's memory
                for start in range(0, n, self.bucket_bytes):
                    yield Message(segment, start, data[start : start + self.bucket_bytes])
                    sent += 1
                continue
            if bucket is None:
                open_seg, bucket = segment, self._bucket(sent)
            self.streams.copy(bucket[offset : offset + n], data)
        if next(planned, None) is not None:
            raise ValueError("the state has fewer tensors than its layout: it changed between its layout and its pass")
        if bucket is not None:
            yield Message(open_seg, 0, bucket[: layout.segments[open_seg]])


class Segments:
    """Receiver side: one buffer set (a version's segments), reused while the segment sizes repeat.
    `ready`: an event after the version's receives (a reader's stream waits for it); `free_after`: an
    event after its last reader's work (a receive into the set waits for it); both of `streams`."""

    def __init__(self, device: torch.device, streams: Streams | None = None) -> None:
        self.device = device
        self.streams: Streams = streams or HostStreams()
        self.buffers: list[torch.Tensor] = []
        self.ready: object = None
        self.free_after: object = None

    def targets(self, layout: Layout) -> list[torch.Tensor]:
        """Where each of the layout's messages goes (uint8 [n] views), the buffers (re)allocated to
        the layout's segment sizes."""
        for k, size in enumerate(layout.segments):
            if k < len(self.buffers) and self.buffers[k].numel() == size:
                continue
            buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
            if k < len(self.buffers):
                self.buffers[k] = buffer
            else:
                self.buffers.append(buffer)
        del self.buffers[len(layout.segments) :]
        return [self.buffers[s][start : start + n] for s, start, n in layout.messages()]

    def tensors(self, layout: Layout) -> dict[str, torch.Tensor]:
        """name -> view of the received bytes, with the sender's shape and dtype."""
        out = {}
        for name, shape, dtype, segment, offset in layout.entries:
            dt = DTYPES[dtype]
            if segment == EMPTY:
                out[name] = torch.empty(shape, dtype=dt, device=self.device)
                continue
            n = dt.itemsize * _numel(shape)
            out[name] = self.buffers[segment][offset : offset + n].view(dt).view(shape)
        return out
