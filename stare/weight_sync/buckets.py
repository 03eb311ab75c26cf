"""The weight broadcast's wire format: a state dict as fixed-size byte messages (pure, no I/O).

Sender (`messages`): iterates `state.items()` exactly once, in order, never indexing by name, so a
lazy mapping (ZeRO-3 parameters gathered one at a time) is never held whole. Small tensors (at most
PACK_MAX_BYTES, or the bucket size if smaller: norms, biases) are copied into a flat uint8 bucket of
`bucket_bytes` (offsets aligned to ALIGN bytes) that is sent when the next one does not fit; a
larger tensor is sent from its own memory (no copy) as `bucket_bytes` chunks of a segment of its
own, so no message exceeds `bucket_bytes` and only the small tensors are copied. Two buckets
alternate: the caller must have awaited message k-1's sends before it pulls message k+1 (the
bucket of k-1 is then rewritten). So the next item of the state is taken while the previous
tensor's sends may still run: a lazy mapping must not rewrite item i's memory for item i+1 (fresh
tensors per item, as a gather into new memory gives, are fine).

Every message is a header `[segment_bytes, offset, n, layout_seq]` (int64 [4]) then `n` payload
bytes, written at `offset` of the current segment (a new segment starts at offset 0). The version
ends with a header-only terminator `[0, 0, -1, layout_seq]`: the layout (name, shape, dtype,
segment, offset per tensor) is known only after the pass, so the sender stores it under
`layout_seq` (only when it changed) before the terminator, and receivers read it then.

Receiver (`Segments` + `tensors`): one contiguous uint8 buffer per segment, reused across versions
with the same segment sizes; every tensor is a view into one segment (bit-identical, no copy).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

ALIGN = 64  # bytes: any dtype can view a packed tensor at an aligned offset
PACK_MAX_BYTES = 2**20  # larger tensors are sent from their own memory
TERMINATOR = -1
DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
                              torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}

LayoutEntry = tuple[str, list[int], str, int, int]  # name, shape, dtype, segment, offset


@dataclass
class Message:
    header: list[int]  # [segment_bytes, offset, n, layout_seq]
    payload: torch.Tensor | None  # uint8 [n] (a bucket slice or a chunk of one big tensor), None: terminator


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def as_bytes(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 [nbytes] view of `t` on `device` (copied only if elsewhere or not contiguous)."""
    t = t.detach()
    if t.device != device:
        t = t.to(device)
    return t.contiguous().reshape(-1).view(torch.uint8)


class BucketPacker:
    """Sender side; holds two flat buckets of `bucket_bytes` on `device`, reused across versions."""

    def __init__(self, bucket_bytes: int, device: torch.device):
        if bucket_bytes < ALIGN:
            raise ValueError(f"bucket size {bucket_bytes} bytes is below {ALIGN}: raise system.weight_sync_bucket_mb")
        self.bucket_bytes, self.device = bucket_bytes, device
        self.pack_bytes = min(bucket_bytes, PACK_MAX_BYTES)
        self._buckets: list[torch.Tensor] = []
        self.layout: list[LayoutEntry] = []

    def _bucket(self, k: int) -> torch.Tensor:
        while len(self._buckets) <= k % 2:
            self._buckets.append(torch.empty(self.bucket_bytes, dtype=torch.uint8, device=self.device))
        return self._buckets[k % 2]

    def messages(self, state: Mapping[str, torch.Tensor], layout_seq_of) -> Iterator[Message]:
        """The messages of one version. `layout_seq_of(layout)` (called once, after the pass)
        returns the key the layout is stored under; it goes into the terminator."""
        self.layout = []
        segment, fill, sent = -1, 0, 0  # the open bucket's segment index and fill; messages sent
        for name, value in state.items():  # the one pass
            if value.dtype not in DTYPES.values():
                raise TypeError(f"weight {name}: dtype {value.dtype} cannot be broadcast (supported: {sorted(DTYPES)})")
            data = as_bytes(value, self.device)
            n = data.numel()
            entry = (name, list(value.shape), str(value.dtype))
            if n > self.pack_bytes:  # a segment of its own, sent from the tensor's memory
                if fill:
                    yield Message([fill, 0, fill, 0], self._bucket(sent)[:fill])
                    sent, fill = sent + 1, 0
                segment += 1
                self.layout.append((*entry, segment, 0))
                for start in range(0, n, self.bucket_bytes):
                    chunk = data[start:start + self.bucket_bytes]
                    yield Message([n, start, chunk.numel(), 0], chunk)
                    sent += 1
                continue
            if fill == 0 or _aligned(fill) + n > self.bucket_bytes:
                if fill:
                    yield Message([fill, 0, fill, 0], self._bucket(sent)[:fill])
                    sent += 1
                segment, fill = segment + 1, 0
            offset = _aligned(fill)
            self._bucket(sent)[offset:offset + n].copy_(data)
            self.layout.append((*entry, segment, offset))
            fill = offset + n if n else max(fill, offset)
            if fill == 0:  # only empty tensors so far: keep the segment open but non-empty on the wire
                fill = 1
        if fill:
            yield Message([fill, 0, fill, 0], self._bucket(sent)[:fill])
        yield Message([0, 0, TERMINATOR, layout_seq_of(self.layout)], None)


class Segments:
    """Receiver side: one buffer set (a version's segments), reused while the segment sizes repeat."""

    def __init__(self, device: torch.device):
        self.device = device
        self.buffers: list[torch.Tensor] = []
        self._count = 0

    def start(self) -> None:
        self._count = 0

    def target(self, header: list[int]) -> torch.Tensor:
        """Where the payload of a message with `header` goes (uint8 [n])."""
        segment_bytes, offset, n, _ = header
        if offset == 0:
            k = self._count
            self._count += 1
            if k < len(self.buffers) and self.buffers[k].numel() == segment_bytes:
                pass
            elif k < len(self.buffers):
                self.buffers[k] = torch.empty(segment_bytes, dtype=torch.uint8, device=self.device)
            else:
                self.buffers.append(torch.empty(segment_bytes, dtype=torch.uint8, device=self.device))
        if self._count == 0 or offset + n > self.buffers[self._count - 1].numel():
            raise ValueError(f"weight message {header} does not fit the segment it continues")
        return self.buffers[self._count - 1][offset:offset + n]

    def finish(self) -> None:
        del self.buffers[self._count:]

    def tensors(self, layout: list[LayoutEntry]) -> dict[str, torch.Tensor]:
        """name -> view of the received bytes, with the sender's shape and dtype."""
        out = {}
        for name, shape, dtype, segment, offset in layout:
            dt = DTYPES[dtype]
            n = dt.itemsize * _numel(shape)
            out[name] = self.buffers[segment][offset:offset + n].view(dt).view(shape)
        return out


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
