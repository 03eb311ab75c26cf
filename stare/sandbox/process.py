"""`ProcessSandbox`: the real sandbox, one launcher process (`_launcher.py`) per run; see the
package docstring for what each isolation mode covers."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from stare.sandbox.limits import (
    Isolation,
    LimitName,
    SandboxConfig,
    SandboxResult,
    SandboxStatus,
    SandboxUnavailable,
)
from stare.sandbox.output import _limit_from_stderr, _Pump, _write_quietly

_LAUNCHER = Path(__file__).with_name("_launcher.py")
_LOCK_DIR = "/run/stare-sandbox"


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
        "at a world-readable interpreter such as /usr/bin/python3"
    )


def unavailable_reason(isolation: Isolation) -> str | None:
    """Why `isolation` cannot work in this process (with the fix), or None if it may."""
    if sys.platform != "linux":
        return "the sandbox needs Linux (namespaces, seccomp, prlimits)"
    if isolation in ("namespaces", "process") and os.geteuid() != 0:
        return (
            f'isolation="{isolation}" needs root (to switch to a throwaway uid); run the '
            'reward worker as root, or use isolation="unprivileged" for trusted code only'
        )
    return None


class ProcessSandbox:
    """The real `Sandbox`: one launcher process per run (see `_launcher.py`).

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
                hint = (
                    " Fix: give the process CAP_SYS_ADMIN and allow unshare/mount (Docker: "
                    "--cap-add SYS_ADMIN --security-opt seccomp=unconfined --security-opt "
                    'apparmor=unconfined), or use isolation="process" where that cannot be.'
                )
            raise SandboxUnavailable(
                f'isolation="{self.config.isolation}" does not work here: '
                f"{result.detail or result.stderr.strip() or result.status}.{hint}"
            )

    def run(
        self, code: str, *, stdin: bytes | str = b"", files: Mapping[str, bytes | str] | None = None
    ) -> SandboxResult:
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
            fd = os.open(f"{_LOCK_DIR}/uid-{uid}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
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
        raise SandboxUnavailable(f"uid_slots: all {self.config.uid_slots} throwaway uids are in use; raise uid_slots")

    def _spec(self, staging: str, uid: int | None, status_fd: int, control_fd: int) -> dict[str, Any]:
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
        env.update(
            PATH="/usr/local/bin:/usr/bin:/bin",
            LANG="C.UTF-8",
            LC_ALL="C.UTF-8",
            OPENBLAS_NUM_THREADS="1",
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
        )
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
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(status_w, control_r),
                start_new_session=True,
                cwd="/",
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            )
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
                    _write_quietly(control_w, b"o")  # the launcher stops the run
                    io.asked_stop = True
                left = deadline - time.monotonic()
                if left <= 0:
                    backstop = True
                    break
                io.pump(min(left, 1.0))
        finally:
            os.close(control_w)  # EOF: a live launcher stops the run
            _, wait_status, rusage = self._reap(proc, uid)
            io.close()
            os.close(status_r)
        wall = time.monotonic() - start
        records: dict[str, Any] = {}
        for line in io.status.decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                records.update(json.loads(line))
        return self._verdict(io, records, backstop, wall, rusage, wait_status)

    def _reap(self, proc: subprocess.Popen[bytes], uid: int | None) -> tuple[int, int, resource.struct_rusage]:
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
                    subprocess.run(
                        [
                            self._python,
                            "-I",
                            "-S",
                            "-B",
                            str(_LAUNCHER),
                            json.dumps({"sweep_uid": uid, "status_fd": 2}),
                        ],
                        stdin=subprocess.DEVNULL,
                        capture_output=True,
                        timeout=10,
                        env={"PATH": "/usr/bin:/bin"},
                    )
                break
            time.sleep(0.005)
        proc.returncode = os.waitstatus_to_exitcode(status)
        return pid, status, rusage

    def _verdict(
        self,
        io: _Pump,
        records: dict[str, Any],
        backstop: bool,
        wall: float,
        rusage: resource.struct_rusage,
        wait_status: int,
    ) -> SandboxResult:
        cfg = self.config
        stdout = io.out[1].decode("utf-8", errors="replace")
        stderr = io.out[2].decode("utf-8", errors="replace")

        def result(status: SandboxStatus, limit: LimitName | None = None, detail: str | None = None) -> SandboxResult:
            return SandboxResult(
                status=status,
                limit_fired=limit,
                detail=detail,
                stdout=stdout,
                stderr=stderr,
                output_truncated=io.overflowed,
                wall_s=round(wall, 4),
                cpu_s=round(rusage.ru_utime + rusage.ru_stime, 4),
                exit_code=records.get("exit_code"),
                signal=records.get("signal"),
            )

        if "setup_error" in records:
            return result("sandbox_error", detail=records["setup_error"])
        if io.overflowed:
            return result("output_limit", "max_output_bytes")
        if records.get("stopped") == "wall_s" or backstop:
            return result("timeout", "wall_s")
        if "exit_code" not in records:
            return result("sandbox_error", detail=f"launcher ended without a verdict (wait status {wait_status})")
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
