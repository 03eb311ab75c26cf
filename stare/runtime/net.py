"""Small network helpers shared by the launcher, the learner and the tests."""

from __future__ import annotations

import os
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on `host` (another process may still take it before you bind)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_free(host: str, port: int) -> bool:
    """Whether `port` on `host` can be bound right now (SO_REUSEADDR, as a listening server would)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def port_holder(port: int) -> str | None:
    """Who listens on TCP `port` on this machine: "pid N (command line)", "another user's process" when
    the socket is not ours to inspect, or None when nobody listens (Linux /proc; None elsewhere).
    For error lines: a taken port named with its holder."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            # local address "HEX_IP:HEX_PORT", state 0A = LISTEN, inode in column 10
            if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(parts[9])
    if not inodes:
        return None
    targets = {f"socket:[{i}]" for i in inodes}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in targets:
                    return f"pid {pid} ({_cmdline(pid)})"
            except OSError:
                continue
    return "another user's process"


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return "?"
    text = " ".join(raw.replace(b"\0", b" ").decode(errors="replace").split())
    return text if len(text) <= 120 else text[:117] + "..."


def port_taken_message(field: str, host: str, port: int, fix: str) -> str:
    """One line for a configured port that cannot be bound: the field, the address, who holds it, the fix."""
    holder = port_holder(port)
    by = f" by {holder}" if holder else ""
    return f"{field} {port} on {host} is in use{by}; {fix}"
