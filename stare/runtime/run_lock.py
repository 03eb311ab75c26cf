"""One writer per run folder: the lock every process that writes a run folder takes first.

    <run dir>/.lock    flock(2)ed by the writer; a JSON record of who holds it (pid, host, command, since)

Who takes it: `stare train`; `stare up` on processes, for the whole supervised run (it hands the locked
descriptor to its learner, so a learner it restarts is never refused by its own parent); the learner
role (`stare learner`: a compose container, a process started by hand); `stare up --target ray`'s
driver (its learner actor, not its child, proceeds under the driver's lock through the token in the
record). Any other writer is refused with one line naming the holder.

Why flock: the lock belongs to the open file description, is shared with children that inherit the
descriptor, survives exec, and is released when its last descriptor closes, i.e. when the holder dies,
however it dies (man 2 flock); NFS clients emulate it as a whole-file byte-range lock (Linux >= 2.6.12).
The file is never unlinked (a lock on an unlinked file would not exclude a process that creates a new
one); a clean release empties the record.

Stale locks: a non-empty record under a lock this process could take means that its holder died
without releasing it. Written on the same kernel (the boot id; containers on one host share it), flock
is the proof: the lock is taken over with a warning naming the dead holder. Written on another kernel
(a run folder on a shared filesystem whose mount does not propagate locks), the record is the only
evidence: its holder renews the file's mtime every RENEW_S, and a record fresher than STALE_S is a
live holder's. A filesystem without flock falls back to the same record (same host: the pid is asked).
Not covered: two hosts on a filesystem without lock propagation within STALE_S of a holder's death.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import shlex
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOCK_FILE = ".lock"
FD_ENV = "STARE_RUN_LOCK_FD"  # a launcher's locked descriptor, inherited by its learner (`stare up` on processes)
TOKEN_ENV = "STARE_RUN_LOCK_TOKEN"  # the token of a launcher's record (the Ray target's learner actor)
RENEW_S = 10.0  # the holder touches the record this often
STALE_S = 60.0  # a record from another kernel untouched for this long is a dead holder's
NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}  # a filesystem without flock
UNWRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM}


class RunLockError(ValueError):
    """The run folder is held by another live writer; the message names it and what to do."""


class RunFolderError(ValueError):
    """The run folder cannot be written (read-only, no permission, a full disk); the message says what to do."""


def boot_id() -> str:
    """This kernel's boot id (the same in every container of the host); '' where there is none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def command_line() -> str:
    """What this process is, for the record: `stare up --config x.yaml` rather than a Python path."""
    argv = list(sys.argv)
    if argv and Path(argv[0]).name in ("stare", "__main__.py", "-m", "-c"):
        argv[0] = "stare"
    return " ".join(shlex.quote(a) for a in argv)[:300]


@dataclass
class Holder:
    """A lock record: who holds (or held) the run folder."""

    pid: int
    host: str
    boot: str
    command: str
    since: float
    token: str = ""

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        try:
            raw = json.loads(text)
            return cls(
                int(raw["pid"]),
                str(raw["host"]),
                str(raw.get("boot", "")),
                str(raw.get("command", "?")),
                float(raw.get("since", 0.0)),
                str(raw.get("token", "")),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        command = self.command if len(self.command) <= 100 else self.command[:97] + "..."
        return f"pid {self.pid} on host {self.host} ({command}, since {when})"

    def same_kernel(self) -> bool:
        return bool(self.boot) and self.boot == boot_id()


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


def holders_by_fd(path: Path) -> list[int]:
    """Pids of this machine's processes that have `path` open (/proc/*/fd), this one excepted: who keeps a
    lock whose recorded holder is gone (a child that inherited it)."""
    try:
        target = path.stat()
    except OSError:
        return []
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            for fd in (proc / "fd").iterdir():
                st = fd.stat()
                if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                    found.append(int(proc.name))
                    break
        except OSError:
            continue
    return sorted(p for p in found if p != os.getpid())


def unwritable(run_dir: Path, err: OSError, *, resume: bool) -> RunFolderError:
    """The one line for a run folder that cannot be written (EROFS, EACCES)."""
    why = "is on a read-only file system" if err.errno == errno.EROFS else "is not writable (permission denied)"
    fix = (
        "copy it to a writable disk and resume the copy (stare train --resume COPY)"
        if resume
        else "set run.output_dir to a writable folder"
    )
    return RunFolderError(f"run folder {run_dir} {why}: a run writes its lock, logs and checkpoints there; {fix}")


class RunLock:
    """`with RunLock(run_dir):` holds the folder's lock (the module docstring). `resume`: a clash does not
    suggest another run.name. `say` gets the warning of a lock taken over from a dead holder. `token`:
    what a delegate of this holder (the Ray target's learner actor) presents in STARE_RUN_LOCK_TOKEN."""

    def __init__(
        self,
        run_dir: Path,
        *,
        resume: bool = False,
        command: str | None = None,
        say: Callable[[str], None] = print,
        token: str | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.resume, self.say = resume, say
        self.command = command or command_line()
        self.token = token or secrets.token_hex(8)
        self.fd: int | None = None
        self.mode = ""  # held: ours; inherited: our launcher's descriptor; delegated: our launcher holds it
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    # ---------------------------------------------------------------- acquire / release
    def acquire(self) -> RunLock:
        inherited = self._inherited_fd()
        if inherited is not None:
            self.fd, self.mode = inherited, "inherited"
            return self
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            if err.errno in UNWRITABLE:
                raise unwritable(self.run_dir, err, resume=self.resume) from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Holder.parse(_read(fd))
            os.close(fd)
            if holder is not None and holder.token and holder.token == os.environ.get(TOKEN_ENV):
                self.mode = "delegated"
                return self
            raise self._clash(holder) from None
        except OSError as err:
            if err.errno not in NO_FLOCK:
                os.close(fd)
                raise
            previous = Holder.parse(_read(fd))  # no flock on this filesystem: the record decides
            if previous is not None and (
                pid_alive(previous.pid) if previous.host == socket.gethostname() else _fresh(fd)
            ):
                os.close(fd)
                raise self._clash(previous) from None
            self._take(fd, previous)
            return self
        previous = Holder.parse(_read(fd))
        if previous is not None and not previous.same_kernel() and _fresh(fd):
            os.close(fd)
            raise self._clash(previous)
        self._take(fd, previous)
        return self

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
        if self.fd is not None and self.mode == "held":
            with contextlib.suppress(OSError):  # a clean release leaves no record to be taken for a stale one
                os.ftruncate(self.fd, 0)
            os.close(self.fd)  # our description's last descriptor here: the flock goes
        self.fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def child_env(self) -> dict[str, str]:
        """The environment a child that writes this run folder needs, with `pass_fds=(lock.fd,)` to Popen."""
        return {FD_ENV: str(self.fd)} if self.fd is not None else {}

    # ---------------------------------------------------------------- pieces
    def _take(self, fd: int, previous: Holder | None) -> None:
        if previous is not None:
            self.say(
                f"warning: taking over the lock of run folder {self.run_dir}: its holder, {previous.describe()}, "
                "is gone without releasing it"
            )
        self.fd, self.mode = fd, "held"
        record: dict[str, Any] = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "boot": boot_id(),
            "command": self.command,
            "since": time.time(),
            "token": self.token,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        os.fsync(fd)
        self._renewer = threading.Thread(target=self._renew, name="run-lock", daemon=True)
        self._renewer.start()

    def _inherited_fd(self) -> int | None:
        """The launcher's locked descriptor, when this process inherited it for this folder."""
        raw = os.environ.get(FD_ENV, "")
        if not raw.isdigit():
            return None
        fd = int(raw)
        try:
            mine, lock = os.fstat(fd), self.path.stat()
            if (mine.st_dev, mine.st_ino) != (lock.st_dev, lock.st_ino):
                return None
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the same open file description: granted
        except OSError:
            return None
        return fd

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_S):
            fd = self.fd
            if fd is None:
                return
            with contextlib.suppress(OSError):
                os.utime(fd)

    def _clash(self, holder: Holder | None) -> RunLockError:
        other = "" if self.resume else ", or choose another run.name"
        if holder is None:
            return RunLockError(
                f"run folder {self.run_dir} is in use by another process (no holder record in {self.path}): "
                f"wait for it to finish or stop it{other}"
            )
        who, pids = holder.describe(), [holder.pid]
        if holder.same_kernel() and not pid_alive(holder.pid):
            pids = holders_by_fd(self.path) or pids  # e.g. the learner of a `stare up` that was killed
            who += f", now gone; still held by pid {', '.join(map(str, pids))}, which inherited it"
        return RunLockError(
            f"run folder {self.run_dir} is in use by {who}: wait for it to finish or stop it "
            f"(kill -TERM {' '.join(map(str, pids))}){other}"
        )


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 4096, 0).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _fresh(fd: int) -> bool:
    return time.time() - os.fstat(fd).st_mtime < STALE_S


def write_failure(err: OSError, run_dir: Path, *, again: str) -> RunFolderError | None:
    """The one line for a write into `run_dir` that failed on a full disk (with the last complete checkpoint)
    or a read-only / unwritable one; None for any other error. `again`: how to continue once fixed."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        latest = run_dir / "checkpoints" / "latest"
        try:
            tag = latest.read_text(encoding="utf-8").strip() if latest.is_file() else ""
            last = f"the last complete checkpoint is step {int(tag.removeprefix('step_'))} ({latest.parent / tag})"
        except (OSError, UnicodeDecodeError, ValueError):
            last = "no checkpoint is complete yet"
        return RunFolderError(
            f"disk full writing {err.filename or run_dir}; {last}; free space on that disk, then {again}"
        )
    if err.errno in UNWRITABLE:
        return unwritable(run_dir, err, resume=True)
    return None
