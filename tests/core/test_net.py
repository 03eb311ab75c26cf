"""stare.runtime.net: who holds a port (from /proc), and what would stop `docker compose up` half way
(a published port in use, a missing secret file). Real sockets of this process; no Docker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from stare.runtime import net


@pytest.fixture
def listening():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]


def test_the_holder_of_a_listening_port_is_named_with_its_command_line(listening):
    holder = net.port_holder(listening)
    assert holder is not None and holder.startswith(f"pid {os.getpid()} (")
    assert "python" in holder and "pytest" in holder  # this process's command line


def test_a_child_process_holding_the_port_is_named_not_this_one():
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1); "
            "print(s.getsockname()[1], flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(child.stdout.readline())
        holder = net.port_holder(port)
        assert holder is not None and holder.startswith(f"pid {child.pid} ({sys.executable} -c import socket")
        assert not net.port_free("127.0.0.1", port)
        assert net.port_in_use("127.0.0.1", port).startswith(f"127.0.0.1:{port} is in use by pid {child.pid} (")
    finally:
        child.kill()
        child.wait(timeout=10)


def test_nothing_listening_has_no_holder(listening):
    free = net.free_port()
    assert net.port_holder(free) is None and net.port_free("127.0.0.1", free)
    assert net.port_in_use("127.0.0.1", free) == f"127.0.0.1:{free} is in use"  # bound, not listening: no name


def test_published_ports_reads_both_port_syntaxes():
    config = {
        "services": {
            "control-cpu": {"ports": ["8321:8321"]},
            "prometheus": {"ports": ["127.0.0.1:9090:9090"]},
            "grafana": {"ports": [{"published": "3000", "host_ip": "127.0.0.1", "target": 3000, "protocol": "tcp"}]},
            "dns": {"ports": ["53:53/udp", {"published": 5353, "target": 53, "protocol": "udp"}]},
            "picked": {"ports": ["8080", {"target": 80}]},  # Docker picks the host port: nothing to check
        }
    }
    assert net.published_ports(config) == [
        ("control-cpu", "0.0.0.0", 8321),
        ("grafana", "127.0.0.1", 3000),
        ("prometheus", "127.0.0.1", 9090),
    ]


def test_a_held_published_port_is_one_line_naming_holder_and_variable(listening):
    config = {
        "services": {
            "control-cpu": {"ports": [f"127.0.0.1:{listening}:8321"]},
            "redis": {},
            "rollout-cpu": {"ports": []},
        }
    }
    (line,) = net.compose_port_clashes(config)
    assert line.startswith(f"control-cpu: 127.0.0.1:{listening} is in use by pid {os.getpid()} (")
    assert line.endswith(f"(STARE_CONTROL_PORT={listening + 1})")
    assert net.compose_port_clashes(config, running=["control-cpu"]) == []  # its own container holds it


def test_a_missing_secret_file_of_a_service_is_named(tmp_path):
    made = tmp_path / "api-token"
    made.write_text("x")
    config = {
        "services": {"control": {"secrets": [{"source": "api"}, {"source": "redis"}]}},
        "secrets": {
            "api": {"file": str(made)},
            "redis": {"file": str(tmp_path / "redis-password")},
            "unused": {"file": str(tmp_path / "nothing")},
        },
    }
    assert net.compose_preflight(config) == [
        f"secret redis: {tmp_path / 'redis-password'} does not exist; run scripts/make_secrets.sh (it keeps existing ones)"
    ]
