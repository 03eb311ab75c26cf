"""A real `redis-server` child process: a free port, its own directory, AOF on.

Used by `stare up` (when no --redis-url is given), the tests and the benches.

`redis_server(dir)` is a context manager yielding a `RedisServer` (its `url`, `kill()`, `start()`,
`restart()`); the server is SIGKILLed on exit whatever happened. With the defaults every write is
fsynced to the AOF (`--appendonly yes --appendfsync always`, no RDB snapshots), so a SIGKILL +
`start()` on the same port and directory keeps streams, groups and pending entries.
Not covered: replication, Redis Cluster, TLS.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from stare.net import free_port

REDIS_SERVER = "redis-server"


def have_redis_server() -> bool:
    return shutil.which(REDIS_SERVER) is not None


@dataclass
class RedisServer:
    dir: Path
    port: int
    appendonly: bool = True
    appendfsync: str = "always"
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start (again) on the same port and directory; returns once it answers PING."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"redis-server on port {self.port} is already running")
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--save", "", "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", self.appendfsync,
                "--daemonize", "no", "--protected-mode", "no", "--logfile", str(self.dir / "redis.log")]
        # its own session: a Ctrl-C in the terminal reaches `stare up`, which stops Redis last
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._wait_for_ping(timeout_s)

    @classmethod
    def on_free_port(cls, dir: Path, *, appendonly: bool = True, appendfsync: str = "always") -> RedisServer:
        """Started on a free local port with its files in `dir`; retries a port taken between pick and bind."""
        dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            server = cls(dir, free_port(), appendonly, appendfsync)
            try:
                server.start()
                return server
            except RuntimeError:
                server.kill()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM (redis-server flushes its AOF and exits), SIGKILL after grace_s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs, only what the AOF already holds survives."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def _wait_for_ping(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {self.proc.returncode} on port {self.port}:\n{log}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):  # -LOADING while it replays the AOF
                        return
            except OSError:
                pass
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING within {timeout_s}s")


@contextlib.contextmanager
def redis_server(dir: Path, *, appendonly: bool = True, appendfsync: str = "always") -> Iterator[RedisServer]:
    """A running redis-server in `dir`, killed on exit. Retries a port taken between pick and bind."""
    server = RedisServer.on_free_port(dir, appendonly=appendonly, appendfsync=appendfsync)
    try:
        yield server
    finally:
        server.kill()
