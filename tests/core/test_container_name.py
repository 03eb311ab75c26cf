"""stare.runtime.container_name: a compose replica's number from Docker's embedded DNS, so container
stare-rollout-cpu-2 runs worker rollout-cpu-2. Docker does not run here: a DNS server built with
dnspython (an independent implementation of RFC 1035) answers on a loopback port the way Docker's
does (moby libnetwork `ResolveIP`: `<container name>.<network>`); scripts/compose_e2e.sh checks the
real one."""

from __future__ import annotations

import socket
import threading
import time

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest

from stare.runtime import container_name as cn
from stare.runtime.process import resolve_worker_name


class PtrServer:
    """A UDP DNS server on 127.0.0.1 answering PTR queries from `names` (address -> name); NXDOMAIN
    for others; silent while `mute`. Records the questions it was asked."""

    def __init__(self, names: dict[str, str]):
        self.names, self.mute, self.asked = names, False, []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                wire, peer = self.sock.recvfrom(512)
            except TimeoutError:
                continue
            query = dns.message.from_wire(wire)
            question = query.question[0]
            self.asked.append((question.name.to_text(), dns.rdatatype.to_text(question.rdtype), query.flags))
            if self.mute:
                continue
            reply = dns.message.make_response(query)
            address = ".".join(reversed(question.name.to_text().split(".")[:4]))
            if address in self.names:
                reply.answer.append(dns.rrset.from_text(question.name, 600, "IN", "PTR", self.names[address] + "."))
            else:
                reply.set_rcode(dns.rcode.NXDOMAIN)
            self.sock.sendto(reply.to_wire(), peer)  # dnspython compresses the answer's name (a pointer)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def dns_server():
    server = PtrServer({"172.18.0.5": "stare-rollout-cpu-2.stare_internal", "10.0.3.7": "stare-e2e-reward-cpu-11.x"})
    yield server
    server.close()


def test_the_ptr_query_is_what_a_dns_server_reads(dns_server):
    assert cn.reverse_lookup("172.18.0.5", "127.0.0.1", dns_server.port) == "stare-rollout-cpu-2.stare_internal"
    ((name, rdtype, flags),) = dns_server.asked
    assert (name, rdtype) == ("5.0.18.172.in-addr.arpa.", "PTR") and flags & dns.flags.RD


def test_an_unknown_address_or_a_silent_server_is_none(dns_server):
    assert cn.reverse_lookup("172.18.0.99", "127.0.0.1", dns_server.port) is None
    dns_server.mute = True
    t0 = time.monotonic()
    assert cn.reverse_lookup("172.18.0.5", "127.0.0.1", dns_server.port, timeout_s=0.2, tries=2) is None
    assert 0.35 < time.monotonic() - t0 < 2.0  # two tries of 0.2 s, then it gives up


def test_the_container_name_is_the_first_label(dns_server, tmp_path):
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("search x\nnameserver 127.0.0.11\noptions ndots:0\n")
    assert cn.docker_dns_configured(resolv)
    got = cn.container_name(resolv_conf=resolv, server="127.0.0.1", port=dns_server.port, address="10.0.3.7")
    assert got == "stare-e2e-reward-cpu-11"


def test_outside_docker_there_is_no_container_name(tmp_path):
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 10.0.0.2\n")
    assert not cn.docker_dns_configured(resolv) and cn.container_name(resolv_conf=resolv) is None
    assert cn.container_name(resolv_conf=tmp_path / "absent") is None


def test_a_malformed_or_foreign_answer_is_not_a_name():
    query = cn.ptr_query("172.18.0.5", 7)
    reply = dns.message.make_response(dns.message.from_wire(query))
    reply.answer.append(dns.rrset.from_text("5.0.18.172.in-addr.arpa.", 600, "IN", "PTR", "a-b-1.net."))
    wire = reply.to_wire()
    assert cn.parse_ptr_answer(wire, 7) == "a-b-1.net"
    assert cn.parse_ptr_answer(wire, 8) is None  # the answer to another query
    with pytest.raises(ValueError, match="truncated or malformed"):
        cn.parse_ptr_answer(wire[:-3], 7)


@pytest.mark.parametrize(
    ("container", "prefix", "number"),
    [
        ("stare-rollout-cpu-2", "rollout-cpu-", 2),
        ("stare-e2e-reward-cpu-11", "reward-cpu-", 11),
        ("my-project-reward-1", "reward-", 1),
        ("stare-reward-cpu-1", "reward-", None),  # another service's replica
        ("stare-rollout-cpu-0", "rollout-cpu-", None),  # compose numbers from 1
        ("rollout-cpu-1", "rollout-cpu-", None),  # no project: not compose's name
        ("0b1c2d3e4f5a", "rollout-cpu-", None),  # a container id
        (None, "rollout-cpu-", None),
    ],
)
def test_the_replica_number_comes_from_the_compose_name(container, prefix, number):
    assert cn.replica_number(container, prefix) == number


def test_a_compose_replica_is_named_after_its_container(monkeypatch):
    from stare.config import build_config

    monkeypatch.setenv("STARE_WORKER_NAME", "rollout-cpu-{slot}")
    monkeypatch.setattr(cn, "container_name", lambda: "stare-e2e-rollout-cpu-3")  # what Docker's DNS answers there
    cfg = build_config({"run": {"name": "names"}})
    # no Redis is asked (the URL goes nowhere): the container's number is the slot
    assert resolve_worker_name("rollout", None, cfg, "redis://127.0.0.1:1/0") == "rollout-cpu-3"
