"""This container's own name, from Docker's embedded DNS: how a compose replica learns its number.

Compose names the replicas of a service `<project>-<service>-<n>` and tells no container its own
name or number (docker/docs#702). Docker's embedded DNS server, at 127.0.0.11 in every container on
a user-defined network, answers a reverse (PTR) query for a container's address with
`<container name>.<network>` (moby libnetwork/network.go, `ResolveIP`), the lookup docker/compose#9153
suggests. /etc/hosts maps the container's own address to its id, so the C library's reverse lookup
answers the id: this module sends the one PTR query itself (RFC 1035 section 4.1; the in-addr.arpa
name of RFC 1035 section 3.5), UDP, with a timeout.

Outside Docker (no 127.0.0.11 in /etc/resolv.conf), or when the answer is not a container name, it
answers None and the caller falls back to its own naming. IPv4 only (compose's default networks).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import struct
from pathlib import Path

DOCKER_DNS = "127.0.0.11"  # Docker's embedded DNS server on user-defined networks
_PTR, _IN = 12, 1


def ptr_query(address: str, query_id: int) -> bytes:
    """A DNS query message (RFC 1035 4.1) asking the PTR record of IPv4 `address`, recursion desired."""
    labels = [*reversed(address.split(".")), "in-addr", "arpa"]
    qname = b"".join(bytes([len(label)]) + label.encode("ascii") for label in labels) + b"\0"
    return struct.pack(">HHHHHH", query_id, 0x0100, 1, 0, 0, 0) + qname + struct.pack(">HH", _PTR, _IN)


def _name(message: bytes, offset: int) -> tuple[str, int]:
    """The domain name at `offset` (labels and compression pointers, RFC 1035 4.1.4) and the offset
    after it in the message's own sequence."""
    labels: list[str] = []
    end, jumps = None, 0
    while True:
        length = message[offset]
        if length & 0xC0 == 0xC0:  # a pointer to a name elsewhere in the message
            if jumps > 32:
                raise ValueError("DNS answer: a loop of name pointers")
            end = offset + 2 if end is None else end
            offset, jumps = ((length & 0x3F) << 8) | message[offset + 1], jumps + 1
            continue
        if length == 0:
            return ".".join(labels), (offset + 1 if end is None else end)
        labels.append(message[offset + 1 : offset + 1 + length].decode("ascii", "replace"))
        offset += 1 + length


def parse_ptr_answer(message: bytes, query_id: int) -> str | None:
    """The first PTR name of a DNS response to query `query_id`, None when it has none (NXDOMAIN, or
    a response to another query). Raises ValueError on a truncated or malformed message."""
    try:
        ident, flags, qdcount, ancount = struct.unpack(">HHHH", message[:8])
        if ident != query_id or not flags & 0x8000 or flags & 0x000F:
            return None
        offset = 12
        for _ in range(qdcount):
            _, offset = _name(message, offset)
            offset += 4
        for _ in range(ancount):
            _, offset = _name(message, offset)
            rtype, _, _, rdlength = struct.unpack(">HHIH", message[offset : offset + 10])
            offset += 10
            if rtype == _PTR:
                return _name(message, offset)[0]
            offset += rdlength
    except (IndexError, struct.error) as err:
        raise ValueError(f"DNS answer: truncated or malformed ({err})") from None
    return None


def reverse_lookup(
    address: str, server: str = DOCKER_DNS, port: int = 53, timeout_s: float = 1.0, tries: int = 2
) -> str | None:
    """The PTR name of `address` as `server` answers it (None: no answer in `tries` x `timeout_s`)."""
    for _ in range(tries):
        query_id = int.from_bytes(os.urandom(2), "big")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(timeout_s)
            try:
                sock.sendto(ptr_query(address, query_id), (server, port))
                reply, _ = sock.recvfrom(4096)
            except OSError:  # timeout, unreachable
                continue
        try:
            return parse_ptr_answer(reply, query_id)
        except ValueError:
            continue
    return None


def docker_dns_configured(resolv_conf: Path = Path("/etc/resolv.conf")) -> bool:
    """Whether this process resolves through Docker's embedded DNS (a container on a user-defined network)."""
    try:
        text = resolv_conf.read_text()
    except OSError:
        return False
    return any(line.split()[1:2] == [DOCKER_DNS] for line in text.splitlines() if line.startswith("nameserver"))


def own_address() -> str | None:
    """This container's IPv4 address: its hostname's, as Docker writes it into /etc/hosts."""
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
    return None if ipaddress.ip_address(address).is_loopback else address


def container_name(
    *,
    resolv_conf: Path = Path("/etc/resolv.conf"),
    server: str = DOCKER_DNS,
    port: int = 53,
    address: str | None = None,
) -> str | None:
    """This container's name ("stare-rollout-cpu-2"), or None outside Docker's DNS."""
    if server == DOCKER_DNS and not docker_dns_configured(resolv_conf):
        return None
    address = address or own_address()
    if address is None:
        return None
    answer = reverse_lookup(address, server, port)
    return None if not answer else answer.split(".", 1)[0]


def replica_number(name: str | None, prefix: str) -> int | None:
    """n when container `name` is compose's `<project>-<prefix><n>` (prefix "rollout-cpu-"), else None."""
    if not name or not prefix:
        return None
    match = re.fullmatch(rf".+-{re.escape(prefix)}([1-9][0-9]*)", name)
    return int(match.group(1)) if match else None
