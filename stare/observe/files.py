"""Files a run rewrites or appends to, kept whole through crashes and full disks.

`write_atomic(path, data)`: every file a run rewrites (config.yaml, trainer_state.json, manifest.json,
`latest`, machine.json, the report) goes to a temporary name in the same folder, is fsynced, then
renamed over the old one, and the folder is fsynced: a reader sees the old file or the new one, never a
part, and a crash or a full disk leaves the old one (rename is atomic; the directory entry needs its
own fsync: man 2 fsync, man 2 rename).

`read_jsonl(path, warn)`: the append-only logs (metrics.jsonl, eval.jsonl, trained.jsonl) read
tolerantly: a line that is not UTF-8, not JSON or not an object is skipped with a warning naming the
file and its 1-based line; the rest is kept. `cut_jsonl(path, last_step, warn)`: on resume, drop the
lines after the resumed step (never stopping at a bad line) and move unreadable lines to
`<file>.damaged`, so nothing is dropped without a trace.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

Warn = Callable[[str], None]


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new file in `folder` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path | str, data: str | bytes) -> None:
    """Replace `path` with `data` (text is written as UTF-8) all at once; see the module docstring."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:  # a read-only or full folder: named by the file to replace
        raise OSError(err.errno, err.strerror, str(path)) from err
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(path)) from err  # named by the file it replaces, not the temporary
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _lines(path: Path) -> tuple[list[bytes], bool]:
    """The file's lines, and whether its last one is unfinished (no newline at the end)."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    unfinished = lines[-1] != b""
    if not unfinished:
        lines.pop()
    return lines, unfinished


def _parse(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """(the object, None), or (None, why the line is unreadable); a blank line is (None, None)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        return None, f"not UTF-8 (byte 0x{line[err.start]:02x} at column {err.start + 1})"
    if not text.strip():
        return None, None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        return None, f"not valid JSON ({err.msg})"
    if not isinstance(obj, dict):
        return None, f"not a JSON object (a {type(obj).__name__})"
    return obj, None


def read_jsonl(path: Path | str, warn: Warn | None = None) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file in order ([] when it does not exist). A damaged line is skipped with
    a warning `FILE line N: why; skipped` (1-based; `warn` None: silently); an unfinished last line (no
    newline: a writer is on it) is skipped without one."""
    path = Path(path)
    if not path.exists():
        return []
    lines, unfinished = _lines(path)
    rows = []
    for number, line in enumerate(lines, 1):
        obj, why = _parse(line)
        if obj is not None:
            rows.append(obj)
        elif why is not None and warn is not None and not (unfinished and number == len(lines)):
            warn(f"warning: {path} line {number}: {why}; skipped")
    return rows


def cut_jsonl(path: Path | str, last_step: int, warn: Warn) -> None:
    """Keep the lines of steps <= `last_step` (a resumed run writes the later ones again); unreadable
    lines go to `<path>.damaged` with a warning naming each."""
    path = Path(path)
    if not path.exists():
        return
    keep: list[bytes] = []
    damaged: list[bytes] = []
    for number, line in enumerate(_lines(path)[0], 1):
        obj, why = _parse(line)
        step = _step(obj) if obj is not None else None
        if obj is not None and step is None:
            why = "no integer 'step'"
        if why is not None:
            damaged.append(line)
            warn(f"warning: {path} line {number}: {why}; moved to {path.name}.damaged")
        elif step is not None and step <= last_step:
            keep.append(line)
    if damaged:
        with open(path.with_name(path.name + ".damaged"), "ab") as f:
            f.write(b"".join(line + b"\n" for line in damaged))
            f.flush()
            os.fsync(f.fileno())
    write_atomic(path, b"".join(line + b"\n" for line in keep))


def _step(obj: dict[str, Any]) -> int | None:
    step = obj.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None
