"""Reading a W&B offline run file (run-<id>.wandb) without the network: the LevelDB-log framing
W&B uses (a 7-byte header ":W&B", magic, version; 32 KiB blocks of chunks, each with crc32, length
and type FULL/FIRST/MIDDLE/LAST) around `wandb_internal_pb2.Record` protobufs."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

BLOCK = 32 * 1024
FULL, FIRST, LAST = 1, 2, 4


def records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if not data:
        return []
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a chunk header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:  # zero padding up to the block end
            pos += (BLOCK - pos % BLOCK) % BLOCK
            continue
        buf = chunk if kind in (FULL, FIRST) else buf + chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
    return out


def finished_records(path: Path, timeout_s: float = 60.0) -> list:
    """The run file's records once its exit record is on disk: `run.finish()` returns before the
    wandb-core process has flushed an offline run file."""
    deadline = time.monotonic() + timeout_s
    from google.protobuf.message import DecodeError

    while True:
        try:
            out = records(path)
        except (DecodeError, struct.error):  # a chunk still being written
            out = []
        if any(r.WhichOneof("record_type") == "exit" for r in out):
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"{path}: no exit record after {timeout_s}s")
        time.sleep(0.1)


def history(path: Path) -> dict[int, dict]:
    """step -> {key: value} of every history row in the finished run file (W&B's own _keys left out)."""
    rows: dict[int, dict] = {}
    for r in finished_records(path):
        if r.WhichOneof("record_type") == "history":
            row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
            rows.setdefault(r.history.step.num, {}).update({k: v for k, v in row.items() if not k.startswith("_")})
    return rows


def run_files(wandb_dir: Path) -> list[Path]:
    """The run-<id>.wandb files under a WANDB_DIR, oldest first."""
    return sorted(Path(wandb_dir).glob("wandb/offline-run-*/run-*.wandb"))
