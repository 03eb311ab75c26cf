"""Small network helpers shared by the launchers, the learner, the control plane and the tests.

Standard library only, and no import of stare: scripts/compose_preflight.py loads this file by
path on a host where only Docker and python3 are installed.

`port_holder` names the process listening on a TCP port from /proc (Linux): the LISTEN sockets of
/proc/net/tcp and tcp6 with that local port give socket inodes, and the process whose
/proc/<pid>/fd links to one holds it. Processes of other users are visible to root only; then it
says so and how to look. Sockets of another network namespace (a container's) are not seen: a
port a container publishes is held on the host by docker-proxy, which is.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp (include/net/tcp_states.h: TCP_LISTEN = 10)
# The variable docker-compose.yml publishes each service's host port with (tests/deploy checks it).
COMPOSE_PORT_VARIABLES = {
    "control": "STARE_CONTROL_PORT",
    "control-cpu": "STARE_CONTROL_PORT",
    "prometheus": "STARE_PROMETHEUS_PORT",
    "grafana": "STARE_GRAFANA_PORT",
}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on `host` (another process may still take it before you bind)."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def port_free(host: str, port: int) -> bool:
    """Whether `port` on `host` can be bound right now (SO_REUSEADDR, as a listening server would)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def listening_inodes(port: int, proc: Path = Path("/proc")) -> set[str]:
    """Inodes of the TCP sockets listening on `port` (any address) in this network namespace."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _command_line(pid: str, proc: Path) -> str:
    try:
        raw = (proc / pid / "cmdline").read_bytes()
    except OSError:
        return "?"
    text = raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()
    return text[:160] + ("..." if len(text) > 160 else "")


def port_holder(port: int, proc: Path = Path("/proc")) -> str | None:
    """Who listens on TCP `port`: "pid N (command line)", or a sentence saying that a process this
    user cannot see does; None when no socket listens on it (nothing, or a bound socket that does not
    listen)."""
    inodes = listening_inodes(port, proc)
    if not inodes:
        return None
    links = {f"socket:[{inode}]" for inode in inodes}
    for pid in sorted((p for p in os.listdir(proc) if p.isdigit()), key=int):
        try:
            fds = os.listdir(proc / pid / "fd")
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            try:
                if os.readlink(proc / pid / "fd" / fd) in links:
                    return f"pid {pid} ({_command_line(pid, proc)})"
            except OSError:
                continue
    return f"a process this user cannot see (as root: ss -ltnp 'sport = :{port}' names it)"


def port_in_use(host: str, port: int) -> str:
    """One clause for a port that cannot be bound: '127.0.0.1:8321 is in use by pid 7 (...)'."""
    holder = port_holder(port)
    return f"{host}:{port} is in use" + (f" by {holder}" if holder else "")


def published_ports(config: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    """(service, host address, port) of every TCP port the services of `config` publish on the host.
    `config` is `docker compose config --format json` (long syntax: published as a string or a
    number; a range or a port left to Docker to pick is skipped), or a compose file's services with
    the short syntax ("127.0.0.1:9090:9090", "8321:8321")."""
    out = []
    for name, service in sorted((config.get("services") or {}).items()):
        for entry in service.get("ports") or []:
            if isinstance(entry, Mapping):
                if entry.get("protocol", "tcp") != "tcp":
                    continue
                host, published = str(entry.get("host_ip") or ""), str(entry.get("published") or "")
            else:
                spec = str(entry)
                if spec.endswith("/udp"):
                    continue
                parts = spec.removesuffix("/tcp").rsplit(":", 2)
                if len(parts) < 2:
                    continue  # "8321": Docker picks the host port
                host, published = (parts[0] if len(parts) == 3 else ""), parts[-2]
            if published.isdigit():
                out.append((str(name), host.strip("[]") or "0.0.0.0", int(published)))
    return out


def compose_port_clashes(config: Mapping[str, Any], running: Iterable[str] = ()) -> list[str]:
    """One line per host port `config`'s services publish that another process holds now (services in
    `running` are skipped: their own container holds it), naming the holder and the fix."""
    skip = set(running)
    lines = []
    for service, host, port in published_ports(config):
        if service in skip or port_free(host, port):
            continue
        variable = COMPOSE_PORT_VARIABLES.get(service)
        fix = f"stop it, or publish {service} on another port" + (f" ({variable}={port + 1})" if variable else "")
        lines.append(f"{service}: {port_in_use(host, port)}; {fix}")
    return lines


def compose_preflight(config: Mapping[str, Any], running: Iterable[str] = ()) -> list[str]:
    """What would make `docker compose up` stop half way on this host, one line each: a published
    port another process holds (compose_port_clashes) and a secret file that does not exist.
    `config` is `docker compose config --format json`; `running`: services whose container runs."""
    lines = compose_port_clashes(config, running)
    services = config.get("services") or {}
    used = {s if isinstance(s, str) else s.get("source") for svc in services.values() for s in svc.get("secrets") or []}
    for name, secret in sorted((config.get("secrets") or {}).items()):
        path = secret.get("file") if isinstance(secret, Mapping) else None
        if name in used and path and not Path(path).is_file():
            lines.append(f"secret {name}: {path} does not exist; run scripts/make_secrets.sh (it keeps existing ones)")
    return lines


def port_taken_message(field: str, host: str, port: int, fix: str) -> str:
    """One line for a configured port that cannot be bound: the field, the address, who holds it, the fix."""
    holder = port_holder(port)
    by = f" by {holder}" if holder else ""
    return f"{field} {port} on {host} is in use{by}; {fix}"
