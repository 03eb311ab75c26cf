"""Run untrusted Python (model-written code) in a confined child process.

Covered, with `isolation="namespaces"` (the default; needs root with CAP_SYS_ADMIN, as on our
machines and CI):
- CPU time: RLIMIT_CPU (SIGXCPU at `cpu_s`, SIGKILL one second later), per process.
- Wall time: the launcher kills the run at `wall_s`; the parent kills the launcher as a backstop.
- Memory: RLIMIT_AS (`memory_mb` of address space per process; allocation fails, Python raises
  MemoryError).
- Processes: RLIMIT_NPROC for a throwaway uid reserved for this run (root ignores RLIMIT_NPROC,
  so the program never runs as root); threads count too.
- Output: stdout + stderr capped at `max_output_bytes`; the run is stopped when it overflows.
- Files: RLIMIT_FSIZE per file, a `disk_mb` tmpfs for everything writable, RLIMIT_NOFILE.
- Network: a new, empty network namespace (not even loopback is up) and a seccomp filter that
  fails socket() for every family but AF_UNIX (unless `allow_network`).
- Filesystem: a new mount namespace whose root is a tmpfs holding read-only binds of /usr (and
  /bin, /lib via their symlinks), the interpreter's install and `readonly_paths`, a fresh /proc
  of the run's own PID namespace, /dev/{null,zero,full,random,urandom}, and the writable /work
  (cwd, holding the program) and /tmp. Nothing else of the host is visible: not /root, /home,
  /etc (a synthetic passwd/group/hosts only), the repository, or the host's /tmp.
- Environment: the program sees only a fixed minimal environment (plus `env`), never the
  parent's; the interpreter runs with -I -S -B (no PYTHON* variables, no site-packages).
- Processes are contained: new session, new PID namespace (the program cannot see or signal
  anything outside it), no_new_privs, a seccomp filter against namespace/mount/ptrace/bpf/keyring/
  io_uring calls; when the program's main process exits, the namespace's init exits and the
  kernel kills everything left (double-forked, setsid'ed daemons included).

`isolation="process"` (root without CAP_SYS_ADMIN, e.g. a default Docker container) keeps the
rlimits, the throwaway uid, seccomp (so no network), the minimal environment and the cleanup
(every process of the uid is killed and reaped), but has no mount or PID namespace: the program
can read whatever the host leaves world-readable and write to world-writable places (/tmp,
/dev/shm), and can see the host's process list. `isolation="unprivileged"` (any user) is for
trusted code only: rlimits except the process count, seccomp, cleanup of descendants; the program
runs as the calling user and can read and write that user's files.

Not covered in any mode: total memory across processes (up to max_processes x memory_mb; put a
memory limit on the container or cgroup), kernel exploits (the seccomp filter narrows the
surface, it is not gVisor), side channels, and disk written by the program being memory (the
tmpfs counts against host RAM, capped at disk_mb). Which of the limits "memory", "process" and
"file" fired is inferred from the interpreter's error text, since those limits make a call fail
rather than kill the process.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import random
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

_LAUNCHER = Path(__file__).with_name("_sandbox_launcher.py")
_LOCK_DIR = "/run/stare-sandbox"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Isolation = Literal["namespaces", "process", "unprivileged"]
SandboxStatus = Literal[
    "ok",             # exit code 0
    "error",          # non-zero exit, no limit recognised
    "timeout",        # cpu_s or wall_s
    "memory",         # memory_mb (MemoryError)
    "process_limit",  # max_processes (fork/thread creation failed)
    "file_limit",     # max_file_mb / disk_mb (EFBIG, ENOSPC)
    "output_limit",   # max_output_bytes
    "killed",         # ended by a signal no limit explains
    "sandbox_error",  # the sandbox itself failed; the program's outcome is unknown
]
LimitName = Literal["cpu_s", "wall_s", "memory_mb", "max_processes", "max_file_mb",
                    "max_output_bytes"]


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be set up on this machine (the message says the fix)."""


class SandboxConfig(BaseModel):
    """Limits and isolation of one sandboxed run; every field is bounded."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    isolation: Isolation = "namespaces"
    """"namespaces" (root + CAP_SYS_ADMIN; full isolation), "process" (root; no filesystem or PID
    isolation), "unprivileged" (any user; trusted code only). See the module docstring."""
    cpu_s: int = Field(2, ge=1, le=3600)
    """CPU seconds per process (RLIMIT_CPU; whole seconds)."""
    wall_s: float = Field(5.0, gt=0, le=3600)
    """Wall-clock seconds for the whole run, from the program's start."""
    memory_mb: int = Field(512, ge=32, le=1 << 20)
    """Address space per process in MiB (RLIMIT_AS)."""
    max_processes: int = Field(16, ge=1, le=4096)
    """Processes and threads of the run's uid at once (RLIMIT_NPROC; not in "unprivileged")."""
    max_output_bytes: int = Field(1 << 20, ge=1024, le=1 << 30)
    """stdout + stderr bytes kept; the run is stopped when the program writes more."""
    max_file_mb: int = Field(16, ge=1, le=1 << 20)
    """Largest file the program may write, in MiB (RLIMIT_FSIZE)."""
    disk_mb: int = Field(64, ge=1, le=1 << 20)
    """Size of the tmpfs that holds /work and /tmp, in MiB ("namespaces" only)."""
    max_open_files: int = Field(64, ge=16, le=1 << 20)
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    allow_network: bool = False
    """Keep the host network and allow every socket family (off: no network at all)."""
    python_executable: str | None = None
    """Interpreter for the program; None: the interpreter running this code (its base install,
    not a virtual environment). Its install prefix is exposed read-only."""
    readonly_paths: tuple[str, ...] = ()
    """Extra absolute host paths exposed read-only at the same place ("namespaces" only)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the program (the rest is fixed and minimal)."""
    uid_base: int = Field(1_000_000, ge=1000, le=2**31 - 2**17)
    """First of the throwaway uids; one is reserved per concurrent run."""
    uid_slots: int = Field(1024, ge=1, le=65536)
    """How many throwaway uids (concurrent runs per machine)."""

    @field_validator("readonly_paths")
    @classmethod
    def _absolute(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        for p in paths:
            if not os.path.isabs(p) or ".." in Path(p).parts:
                raise ValueError(f"readonly_paths: {p!r} must be an absolute path without '..'")
        return paths

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not _ENV_NAME.match(name) or "\0" in value:
                raise ValueError(f"env: {name!r} is not a valid variable name (or has a NUL)")
        return env


class SandboxResult(BaseModel):
    """What one run did. `stdout`/`stderr` are decoded (UTF-8, invalid bytes replaced) and cut
    at the output limit; `limit_fired` names the SandboxConfig field whose limit ended the run."""

    model_config = ConfigDict(frozen=True)

    status: SandboxStatus
    exit_code: int | None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    output_truncated: bool = False
    limit_fired: LimitName | None = None
    wall_s: float = 0.0
    cpu_s: float = 0.0
    """CPU seconds of everything in the run, including ~0.05 s of sandbox setup."""
    detail: str | None = None
    """Why the sandbox failed (status "sandbox_error"), or other notes."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Sandbox(Protocol):
    """Runs one Python program under limits; implementations never raise for what it does."""

    def run(self, code: str, *, stdin: bytes | str = b"",
            files: Mapping[str, bytes | str] | None = None) -> SandboxResult: ...


class InMemorySandbox:
    """A `Sandbox` that runs nothing: answers come from `respond(code, stdin)`. For unit tests of
    code that takes a sandbox (verifiers, scoring), not for executing anything."""

    def __init__(self, respond: Callable[[str, bytes], SandboxResult]):
        self._respond = respond

    def run(self, code: str, *, stdin: bytes | str = b"",
            files: Mapping[str, bytes | str] | None = None) -> SandboxResult:
        return self._respond(code, stdin.encode() if isinstance(stdin, str) else stdin)


def _base_python(python: str | None) -> str:
    """The real interpreter binary (a venv's `python` resolves to its base install)."""
    return os.path.realpath(python or sys.executable)


def _others_can_run(path: str) -> bool:
    """Whether a uid that owns nothing can execute `path` (o+x on every directory above it)."""
    p = Path(path)
    try:
        if p.stat().st_mode & 0o005 != 0o005:
            return False
        return all(parent.stat().st_mode & 0o001 for parent in p.parents)
    except OSError:
        return False


def _process_mode_python(python: str | None) -> str:
    """The interpreter for isolation="process": the program's uid must be able to run it."""
    chosen = _base_python(python)
    if _others_can_run(chosen) and _others_can_run(os.path.dirname(os.path.dirname(chosen))):
        return chosen
    if python is None:
        fallback = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
        if fallback and _others_can_run(_base_python(fallback)):
            return _base_python(fallback)
    raise SandboxUnavailable(
        f"python_executable: {chosen!r} cannot be run by the sandbox's throwaway uid (a parent "
        'directory is not world-executable); with isolation="process" point python_executable '
        "at a world-readable interpreter such as /usr/bin/python3")


def unavailable_reason(isolation: Isolation) -> str | None:
    """Why `isolation` cannot work in this process (with the fix), or None if it may."""
    if sys.platform != "linux":
        return "the sandbox needs Linux (namespaces, seccomp, prlimits)"
    if isolation in ("namespaces", "process") and os.geteuid() != 0:
        return (f'isolation="{isolation}" needs root (to switch to a throwaway uid); run the '
                'reward worker as root, or use isolation="unprivileged" for trusted code only')
    return None


class ProcessSandbox:
    """The real `Sandbox`: one launcher process per run (see `_sandbox_launcher.py`).

    Thread-safe (no preexec_fn; every run has its own uid, pipes and directory); each run costs
    two interpreter start-ups (~0.1 s). `check()` runs a trivial program to prove the isolation
    works here and raises `SandboxUnavailable` with the fix if not.
    """

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        reason = unavailable_reason(self.config.isolation)
        if reason is not None:
            raise SandboxUnavailable(reason)
        if self.config.isolation == "process":
            self._python = _process_mode_python(self.config.python_executable)
        else:
            self._python = _base_python(self.config.python_executable)
        if not os.access(self._python, os.X_OK):
            raise SandboxUnavailable(f"python_executable: {self._python!r} is not executable")

    def check(self) -> None:
        result = self.run("print('ok')")
        if result.status != "ok" or result.stdout.strip() != "ok":
            hint = ""
            if self.config.isolation == "namespaces":
                hint = (' Fix: give the process CAP_SYS_ADMIN and allow unshare/mount (Docker: '
                        '--cap-add SYS_ADMIN --security-opt seccomp=unconfined --security-opt '
                        'apparmor=unconfined), or use isolation="process" where that cannot be.')
            raise SandboxUnavailable(
                f'isolation="{self.config.isolation}" does not work here: '
                f"{result.detail or result.stderr.strip() or result.status}.{hint}")

    def run(self, code: str, *, stdin: bytes | str = b"",
            files: Mapping[str, bytes | str] | None = None) -> SandboxResult:
        """Run `code` as /work/main.py with `stdin` and extra `files` (relative paths in /work)."""
        if isinstance(stdin, str):
            stdin = stdin.encode()
        staging = tempfile.mkdtemp(prefix="stare-sbx-")
        try:
            self._stage(staging, code, files or {})
            with self._reserve_uid() as uid:
                return self._run_staged(staging, uid, stdin)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    # --- internals ---------------------------------------------------------------------------

    @staticmethod
    def _stage(staging: str, code: str, files: Mapping[str, bytes | str]) -> None:
        root = Path(staging, "files")
        root.mkdir()
        Path(staging, "root").mkdir()
        for name, content in {**files, "main.py": code}.items():
            rel = Path(name)
            if rel.is_absolute() or ".." in rel.parts or not rel.parts:
                raise ValueError(f"files: {name!r} must be a relative path inside /work")
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            data = content.encode() if isinstance(content, str) else content
            target.write_bytes(data)

    @contextlib.contextmanager
    def _reserve_uid(self) -> Iterator[int | None]:
        """Hold an exclusive lock on one throwaway uid for the run (None when unprivileged)."""
        if self.config.isolation == "unprivileged":
            yield None
            return
        os.makedirs(_LOCK_DIR, mode=0o700, exist_ok=True)
        rng = random.SystemRandom()
        for _ in range(4 * self.config.uid_slots):
            uid = self.config.uid_base + rng.randrange(self.config.uid_slots)
            fd = os.open(f"{_LOCK_DIR}/uid-{uid}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC,
                         0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield uid
            finally:
                os.close(fd)
            return
        raise SandboxUnavailable(
            f"uid_slots: all {self.config.uid_slots} throwaway uids are in use; raise uid_slots")

    def _spec(self, staging: str, uid: int | None, status_fd: int, control_fd: int) -> dict:
        cfg = self.config
        ro_paths = list(cfg.readonly_paths)
        prefix = os.path.dirname(os.path.dirname(self._python))
        if not prefix.startswith("/usr/") and prefix != "/usr":
            ro_paths.append(prefix)
        if cfg.isolation == "namespaces":
            env = {"HOME": "/work", "TMPDIR": "/tmp"}
        else:
            work = os.path.join(staging, "work")
            env = {"HOME": work, "TMPDIR": os.path.join(work, ".tmp")}
        env.update(PATH="/usr/local/bin:/usr/bin:/bin", LANG="C.UTF-8", LC_ALL="C.UTF-8",
                   OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        env.update(cfg.env)
        mib = 1 << 20
        return {
            "mode": cfg.isolation,
            "staging": staging,
            "uid": uid,
            "gid": uid,
            "wall_s": cfg.wall_s,
            "rlimits": {
                "cpu": [cfg.cpu_s, cfg.cpu_s + 1],
                "as": cfg.memory_mb * mib,
                "nproc": cfg.max_processes if uid is not None else None,
                "fsize": cfg.max_file_mb * mib,
                "nofile": cfg.max_open_files,
            },
            "disk_bytes": cfg.disk_mb * mib,
            "allow_network": cfg.allow_network,
            "ro_paths": ro_paths,
            "argv": [self._python, "-I", "-S", "-B", "main.py"],
            "env": env,
            "status_fd": status_fd,
            "control_fd": control_fd,
        }

    def _run_staged(self, staging: str, uid: int | None, stdin: bytes) -> SandboxResult:
        cfg = self.config
        status_r, status_w = os.pipe()
        control_r, control_w = os.pipe()
        spec = self._spec(staging, uid, status_w, control_r)
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                [self._python, "-I", "-S", "-B", str(_LAUNCHER), json.dumps(spec)],
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(status_w, control_r), start_new_session=True, cwd="/",
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
        except BaseException:
            os.close(status_r)
            os.close(control_w)
            raise
        finally:
            os.close(status_w)
            os.close(control_r)
        io = _Pump(proc, status_r, stdin, cfg.max_output_bytes)
        backstop = False
        try:
            # The launcher enforces wall_s; this deadline only catches a stuck launcher.
            deadline = start + cfg.wall_s + 5.0
            while io.open():
                if io.overflowed and not io.asked_stop:
                    _write_quietly(control_w, b"o")     # the launcher stops the run
                    io.asked_stop = True
                left = deadline - time.monotonic()
                if left <= 0:
                    backstop = True
                    break
                io.pump(min(left, 1.0))
        finally:
            os.close(control_w)                         # EOF: a live launcher stops the run
            _, wait_status, rusage = self._reap(proc, uid)
            io.close()
            os.close(status_r)
        wall = time.monotonic() - start
        records: dict = {}
        for line in io.status.decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                records.update(json.loads(line))
        return self._verdict(io, records, backstop, wall, rusage, wait_status)

    def _reap(self, proc: subprocess.Popen, uid: int | None):
        """Wait for the launcher (SIGKILL its group after 2 s), then sweep the uid if needed."""
        deadline = time.monotonic() + 2.0
        while True:
            pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                pid, status, rusage = os.wait4(proc.pid, 0)
                if uid is not None and self.config.isolation == "process":
                    # The launcher died before its own sweep: kill the uid's processes from here.
                    subprocess.run([self._python, "-I", "-S", "-B", str(_LAUNCHER),
                                    json.dumps({"sweep_uid": uid, "status_fd": 2})],
                                   stdin=subprocess.DEVNULL, capture_output=True, timeout=10,
                                   env={"PATH": "/usr/bin:/bin"})
                break
            time.sleep(0.005)
        proc.returncode = os.waitstatus_to_exitcode(status)
        return pid, status, rusage

    def _verdict(self, io: "_Pump", records: dict, backstop: bool, wall: float, rusage,
                 wait_status: int) -> SandboxResult:
        cfg = self.config
        stdout = io.out[1].decode("utf-8", errors="replace")
        stderr = io.out[2].decode("utf-8", errors="replace")
        base = dict(stdout=stdout, stderr=stderr, output_truncated=io.overflowed,
                    wall_s=round(wall, 4), cpu_s=round(rusage.ru_utime + rusage.ru_stime, 4),
                    exit_code=records.get("exit_code"), signal=records.get("signal"))

        def result(status: SandboxStatus, limit: LimitName | None = None,
                   detail: str | None = None) -> SandboxResult:
            return SandboxResult(status=status, limit_fired=limit, detail=detail, **base)

        if "setup_error" in records:
            return result("sandbox_error", detail=records["setup_error"])
        if io.overflowed:
            return result("output_limit", "max_output_bytes")
        if records.get("stopped") == "wall_s" or backstop:
            return result("timeout", "wall_s")
        if "exit_code" not in records:
            return result("sandbox_error",
                          detail=f"launcher ended without a verdict (wait status {wait_status})")
        sig = records["signal"]
        if sig is not None:
            if sig == signal.SIGXCPU or (sig == signal.SIGKILL and records["cpu_s"] >= cfg.cpu_s):
                return result("timeout", "cpu_s")
            if sig == signal.SIGXFSZ:
                return result("file_limit", "max_file_mb")
            return result("killed", detail=f"killed by {signal.Signals(sig).name}")
        if records["exit_code"] == 0:
            return result("ok")
        return result(*_limit_from_stderr(stderr))


_MEMORY = re.compile(r"^(?:[\w.]+\.)?\w*MemoryError\b", re.MULTILINE)
_PROCESS = re.compile(r"BlockingIOError: \[Errno 11\]|can't (?:start|create) new thread")
_FILE = re.compile(r"\[Errno 27\] File too large|\[Errno 28\] No space left on device")


def _limit_from_stderr(stderr: str) -> tuple[SandboxStatus, LimitName | None]:
    """Attribute a non-zero exit to a limit that makes calls fail (memory, processes, files)."""
    if _MEMORY.search(stderr[-4096:]):
        return "memory", "memory_mb"
    if _PROCESS.search(stderr):
        return "process_limit", "max_processes"
    if _FILE.search(stderr[-4096:]):
        return "file_limit", "max_file_mb"
    return "error", None


def _write_quietly(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, data)


class _Pump:
    """Moves bytes between the parent and the launcher's pipes without blocking."""

    def __init__(self, proc: subprocess.Popen, status_fd: int, stdin: bytes, max_output: int):
        self.sel = selectors.DefaultSelector()
        self.out = {1: bytearray(), 2: bytearray()}
        self.status = bytearray()
        self.max_output = max_output
        self.overflowed = False
        self.asked_stop = False
        self._stdin = memoryview(stdin)
        for stream, tag in ((proc.stdout, 1), (proc.stderr, 2)):
            os.set_blocking(stream.fileno(), False)
            self.sel.register(stream.fileno(), selectors.EVENT_READ, tag)
        os.set_blocking(status_fd, False)
        self.sel.register(status_fd, selectors.EVENT_READ, 0)
        self._proc = proc
        if proc.stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)
            self.sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, -1)

    def open(self) -> bool:
        return any(key.data != -1 for key in self.sel.get_map().values())

    def pump(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            fd, tag = key.fd, key.data
            if tag == -1:
                try:
                    n = os.write(fd, self._stdin[:65536])
                except (BrokenPipeError, BlockingIOError) as exc:
                    n = 0 if isinstance(exc, BlockingIOError) else len(self._stdin)
                self._stdin = self._stdin[n:]
                if not self._stdin:
                    self.sel.unregister(fd)
                    self._proc.stdin.close()
                continue
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                self.sel.unregister(fd)
                continue
            if tag == 0:
                self.status += data[: 1 << 16]
                continue
            room = self.max_output - len(self.out[1]) - len(self.out[2])
            if len(data) > room:
                self.overflowed = True
            self.out[tag] += data[: max(room, 0)]

    def close(self) -> None:
        self.sel.close()
        for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


@functools.cache
def probe(isolation: Isolation) -> str | None:
    """None if a trivial program runs under `isolation` in this process, else why not (with the
    fix). Runs a sandbox once per isolation level and process (cached); for start-up checks."""
    reason = unavailable_reason(isolation)
    if reason is not None:
        return reason
    try:
        ProcessSandbox(SandboxConfig(isolation=isolation)).check()
    except SandboxUnavailable as exc:
        return str(exc)
    return None


def best_isolation() -> Isolation:
    """The strongest isolation that works in this process ("unprivileged" at worst)."""
    for level in ("namespaces", "process"):
        if probe(level) is None:
            return level
    return "unprivileged"
