"""A real `redis-server` child process: a free port, its own directory, AOF on, a password.

Closed by default: each server gets a random password (`requirepass`, in a 0600 config file in its
directory, never on the command line where `ps` shows it); `url` carries it, `public_url` masks it,
`write_url_file(path)` writes the URL into a 0600 file for roles to read (STARE_REDIS_URL_FILE).
A client without the password gets NOAUTH. `password=None` starts an open server.

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
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stare.runtime.net import free_port
from stare.transport.redis_secrets import masked, with_password, write_secret

REDIS_SERVER = "redis-server"


def have_redis_server() -> bool:
    return shutil.which(REDIS_SERVER) is not None


@dataclass
class RedisServer:
    dir: Path
    port: int
    appendonly: bool = True
    appendfsync: str = "always"
    password: str | None = field(default_factory=lambda: secrets.token_hex(24), repr=False)
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """The URL with the password: pass it to clients, never log it (log `public_url`)."""
        plain = f"redis://127.0.0.1:{self.port}/0"
        return plain if self.password is None else with_password(plain, self.password)

    @property
    def public_url(self) -> str:
        return masked(self.url)

    def write_url_file(self, path: Path) -> Path:
        """The URL (with the password) into `path`, mode 0600."""
        return write_secret(path, self.url)

    def start(self, timeout_s: float = 10.0) -> None:
        """Start (again) on the same port and directory; returns once it answers PING."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"redis-server on port {self.port} is already running")
        conf = self.dir / "redis.conf"  # the password lives here, not in argv
        write_secret(conf, f"requirepass {self.password}" if self.password is not None else "")
        args = [
            REDIS_SERVER,
            str(conf),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            self.appendfsync,
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--logfile",
            str(self.dir / "redis.log"),
        ]
        # its own session: a Ctrl-C in the terminal reaches `stare up`, which stops Redis last
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._wait_for_ping(timeout_s)

    @classmethod
    def on_free_port(
        cls, dir: Path, *, appendonly: bool = True, appendfsync: str = "always", password: str | None | bool = True
    ) -> RedisServer:
        """Started on a free local port with its files in `dir`; retries a port taken between pick and bind.
        `password`: True (default) a random one, None or False an open server, else this one."""
        dir.mkdir(parents=True, exist_ok=True)
        chosen = secrets.token_hex(24) if password is True else (password or None)
        for attempt in range(3):
            server = cls(dir, free_port(), appendonly, appendfsync, chosen)
            try:
                server.start()
                return server
            except RuntimeError:
                server.kill()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def alive(self) -> bool:
        """Whether this object's redis-server process is running."""
        return self.proc is not None and self.proc.poll() is None

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
                    if self.password is not None:
                        s.sendall(_command("AUTH", self.password))
                        if not s.recv(64).startswith(b"+OK"):
                            raise RuntimeError(f"redis-server on port {self.port} refused its password")
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):  # -LOADING while it replays the AOF
                        return
            except OSError:
                pass
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING within {timeout_s}s")


def _command(*parts: str) -> bytes:
    """One RESP command (binary safe, unlike the inline form)."""
    out = [f"*{len(parts)}\r\n".encode()]
    for p in parts:
        b = p.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


@contextlib.contextmanager
def redis_server(
    dir: Path, *, appendonly: bool = True, appendfsync: str = "always", password: str | None | bool = True
) -> Iterator[RedisServer]:
    """A running redis-server in `dir` (with a random password unless password=None), killed on
    exit. Retries a port taken between pick and bind."""
    server = RedisServer.on_free_port(dir, appendonly=appendonly, appendfsync=appendfsync, password=password)
    try:
        yield server
    finally:
        server.kill()
