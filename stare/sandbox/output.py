"""Reading a sandboxed run's output: `_Pump` moves bytes between the parent and the launcher's pipes
without blocking (bounded output), and `_limit_from_stderr` tells which limit a failed run hit."""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import subprocess

from stare.sandbox.limits import LimitName, SandboxStatus

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

    def __init__(self, proc: subprocess.Popen[bytes], status_fd: int, stdin: bytes, max_output: int):
        self.sel = selectors.DefaultSelector()
        self.out = {1: bytearray(), 2: bytearray()}
        self.status = bytearray()
        self.max_output = max_output
        self.overflowed = False
        self.asked_stop = False
        self._stdin = memoryview(stdin)
        for stream, tag in ((proc.stdout, 1), (proc.stderr, 2)):
            if stream is None:
                raise ValueError("the sandbox launcher's stdout and stderr must be pipes")
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
                    assert self._proc.stdin is not None  # registered (tag -1) only when stdin is a pipe
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
