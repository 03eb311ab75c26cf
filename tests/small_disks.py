"""Real full and read-only disks for tests: a command run in a private mount namespace where a folder
is a small tmpfs (writes past its size fail with ENOSPC) or a read-only bind mount of itself (EROFS).

As root `unshare --mount`; otherwise `unshare --user --map-root-user --mount` (an unprivileged user
namespace may mount tmpfs and bind mounts: man 7 user_namespaces). The mounts vanish with the
command's process; nothing is left mounted on the machine. `available()` says whether either works
here (tests skip, saying why, where neither does)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path


def _unshare() -> list[str]:
    return ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--mount"]


@lru_cache(maxsize=1)
def available() -> str | None:
    """None when private mounts work here, else why not."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(
        [
            *_unshare(),
            "sh",
            "-c",
            "mount -t tmpfs -o size=64k tmpfs /mnt 2>&1 || mount -t tmpfs -o size=64k tmpfs /tmp",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return None if probe.returncode == 0 else f"cannot mount in a private namespace here: {probe.stdout.strip()[:200]}"


def run_with_mount(
    argv: list[str],
    folder: Path,
    *,
    size_kib: int | None = None,
    read_only: bool = False,
    copy_out: Path | None = None,
    timeout_s: float = 300,
    **kwargs,
) -> subprocess.CompletedProcess:
    """Run `argv` with `folder` as a tmpfs of `size_kib` KiB (its current files copied in first; what
    it holds when `argv` ends is copied to `copy_out`, the tmpfs then vanishes), or bind-mounted
    read-only onto itself."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    q = shlex.quote(str(folder))
    if read_only:
        setup = f"mount --bind {q} {q} && mount -o remount,bind,ro {q}"
    else:
        assert size_kib is not None
        stash = shlex.quote(str(folder) + ".stash")
        setup = (
            f"rm -rf {stash} && cp -a {q} {stash} && mount -t tmpfs -o size={size_kib}k tmpfs {q} && "
            f"cp -a {stash}/. {q}/ && rm -rf {stash}"
        )
    command = " ".join(shlex.quote(a) for a in argv)
    if copy_out is not None:
        out = shlex.quote(str(copy_out))
        script = f"{setup} && {{ {command}; rc=$?; mkdir -p {out} && cp -a {q}/. {out}/; exit $rc; }}"
    else:
        script = f"{setup} && exec {command}"
    return subprocess.run([*_unshare(), "sh", "-c", script], timeout=timeout_s, **kwargs)
