"""Checkpoint manifests: what makes a checkpoint folder whole, and which one a resume loads.

    checkpoints/step_N/...            DeepSpeed's files (every rank's), trainer_state.json
    checkpoints/step_N/manifest.json  written last: every file's size and sha256 (streamed)
    checkpoints/latest                the tag of the newest checkpoint whose manifest was written

`write_manifest` reads every file back from disk (not from memory) and records it; `latest` is
pointed at a tag only after that. `choose_checkpoint` verifies before anything is loaded: the tag
`latest` names if its files match its manifest, else the newest older tag that does, with a
warning naming the damaged file (never silently); with none whole it raises `CheckpointError`
naming the exact file. Checkpoints written before manifests existed (older than every checkpoint
with one) are whole when they hold trainer_state.json, as before.

Cost (docs/troubleshooting.md): sha256 streams each file in 8 MiB blocks, files in parallel
threads (hashlib releases the GIL): ~0.5-1.5 GB/s per core, so a 7B ZeRO-3 checkpoint (~90 GB:
bf16 weights, fp32 master and Adam moments) over 8 shards is read once more at save and once at
resume, ~10-20 s with 8 threads from the page cache; `run.checkpoint_verify: size` checks sizes only
(a file cut short by a full disk is still caught; a flipped bit is not).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from stare.observe.files import write_atomic

MANIFEST = "manifest.json"
TRAINER_STATE = "trainer_state.json"
BLOCK = 8 << 20  # bytes per read while hashing
MAX_THREADS = 8

Verify = Literal["digest", "size"]


class CheckpointError(ValueError):
    """No checkpoint that can be loaded; the message names the damaged file and the fix."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST and not p.name.startswith("."))


def _digests(paths: list[Path]) -> list[str]:
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_THREADS, len(paths), os.cpu_count() or 1))) as pool:
        return list(pool.map(_sha256, paths))


_verified: dict[Path, tuple] = {}  # folder -> the stat signature it had when its digests last matched


def _signature(folder: Path, names) -> tuple:
    stats = [(folder / n).stat() for n in [MANIFEST, *names]]
    return tuple((st.st_size, st.st_mtime_ns, st.st_ino) for st in stats)


def write_manifest(folder: Path, verify: Verify = "digest") -> dict:
    """Record every file under `folder` (read back from disk) in folder/manifest.json; call it last."""
    folder = Path(folder)
    paths = _files(folder)
    files = {str(p.relative_to(folder)): {"size": p.stat().st_size} for p in paths}
    if verify == "digest":
        for p, digest in zip(paths, _digests(paths)):
            files[str(p.relative_to(folder))]["sha256"] = digest
    manifest = {"manifest": 1, "verify": verify, "files": files}
    write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1))
    return manifest


def damage(folder: Path, verify: Verify = "digest") -> str | None:
    """What is wrong with checkpoint `folder` ("FILE: why"), or None when its files match its manifest.
    verify "size" skips the digests even where the manifest has them. A folder verified earlier in
    this process whose files have not changed since (size, mtime, inode) is not hashed again (the
    CLI checks a resume before taking the run's lock, the session before loading)."""
    folder = Path(folder).resolve()
    path = folder / MANIFEST
    if not path.is_file():
        return f"{path}: missing (the checkpoint was cut short before it was complete)"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = manifest["files"]
        assert isinstance(files, dict) and files
    except (ValueError, KeyError, TypeError, AssertionError):
        return f"{path}: unreadable (not a stare checkpoint manifest)"
    digest_check = []
    for name, entry in files.items():
        p = folder / name
        if not p.is_file():
            return f"{p}: missing"
        size = p.stat().st_size
        if not isinstance(entry, dict) or size != entry.get("size"):
            return f"{p}: {size} bytes, the manifest says {entry.get('size') if isinstance(entry, dict) else '?'}"
        if verify == "digest" and "sha256" in entry:
            digest_check.append((p, entry["sha256"]))
    signature = _signature(folder, files)
    if digest_check and _verified.get(folder) == signature:
        return None
    for (p, want), got in zip(digest_check, _digests([p for p, _ in digest_check])):
        if got != want:
            return f"{p}: contents differ from the manifest (sha256 {got[:12]}..., recorded {want[:12]}...)"
    _verified[folder] = signature
    return None


def _legacy(directory: Path) -> Callable[[str], bool]:
    """Whether a tag was written before manifests: it is older than every checkpoint that has one
    (a checkpoint cut short before its manifest is newer than those)."""
    with_manifest = sorted(p.parent.name for p in directory.glob(f"step_*/{MANIFEST}"))
    return lambda tag: not with_manifest or tag < with_manifest[0]


def _named_by_latest(directory: Path) -> tuple[str | None, str | None]:
    """(tag, problem): the tag `latest` names, or why it names none usable."""
    latest = directory / "latest"
    if not latest.is_file():
        return None, f"{latest}: missing"
    try:
        tag = latest.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        return None, f"{latest}: not a tag name (binary contents)"
    if not tag.startswith("step_") or "/" in tag or not (directory / tag).is_dir():
        return None, f"{latest}: names {tag[:60]!r}, not a checkpoint folder under {directory}"
    return tag, None


def checkpoint_problem(
    directory: Path, tag: str, verify: Verify = "digest", legacy: Callable[[str], bool] | None = None
) -> str | None:
    """What is wrong with checkpoint `tag` under `directory` ("FILE: why"), None when it is whole: its files
    match its manifest, or, written before manifests existed, it holds trainer_state.json. A checkpoint
    still being written has no manifest yet: it is not whole."""
    legacy = legacy or _legacy(Path(directory))
    if legacy(tag) and not (directory / tag / MANIFEST).is_file():
        state = directory / tag / TRAINER_STATE
        return None if state.is_file() else f"{state}: missing (the checkpoint was cut short)"
    return damage(directory / tag, verify)


def choose_checkpoint(directory: Path, say: Callable[[str], None] = print, verify: Verify = "digest") -> str:
    """The tag to resume from: `latest`'s if whole, else the newest whole one (with a warning)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: no checkpoints folder; the run saved no checkpoint to resume from")
    legacy = _legacy(directory)

    def problem(tag: str) -> str | None:
        return checkpoint_problem(directory, tag, verify, legacy)

    named, first = _named_by_latest(directory)
    if named is not None:
        first = problem(named)
        if first is None:
            return named
    for tag in sorted((p.name for p in directory.glob("step_*") if p.is_dir()), reverse=True):
        if tag == named or (named is not None and tag > named):
            continue  # newer than `latest`: a save that never finished
        if problem(tag) is None:
            say(
                f"warning: checkpoint damaged: {first}; resuming from the previous complete checkpoint "
                f"{directory / tag} instead"
            )
            return tag
    raise CheckpointError(
        f"{first}; no other complete checkpoint under {directory} to resume from: restore the "
        f"file from a backup, or start the run again under a new run.name"
    )


def holds_checkpoint(directory: Path) -> bool:
    """Whether `directory` (a run's checkpoints/) holds any checkpoint, whole or not, `latest` or not: such
    a run is resumed (or refused as a new run), never started over on top of it."""
    directory = Path(directory)
    return (directory / "latest").exists() or any(p.is_dir() for p in directory.glob("step_*"))


def require_checkpoint(directory: Path, flag: str, verify: Verify = "digest") -> str:
    """The checkpoint a resume of this run will load, verified now (before any lock or setup); a
    fallback's warning is left to the session, which chooses again when it loads (no second hash)."""
    if not any(Path(directory).glob("step_*")):
        raise CheckpointError(
            f"{flag}: {directory} holds no checkpoint (the run stopped before its first one); "
            f"start it again instead of resuming"
        )
    return choose_checkpoint(directory, lambda _: None, verify)
