"""Serving: the background server falls back to a free port and stops cleanly; `stare control`
serves a Redis run state; `stare ctl` prints the API's answers and its errors (real HTTP)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from control_helpers import TOKEN, started
from redis_fixtures import free_port

from learner.engine.deepspeed_engine import child_env
from services.control.app import create_app
from services.control.server import BackgroundServer
from stare.app.cli import main
from stare.config import ControlPlaneSection
from stare.runstate import MemoryRunState


@pytest.fixture
def served(controller):
    state = MemoryRunState("run")
    started(state, controller)
    server = BackgroundServer(create_app(state, ControlPlaneSection(), "run", token=TOKEN), "127.0.0.1", 0).start()
    yield server, state
    server.stop()


def test_a_taken_port_falls_back_to_a_free_one_and_stop_frees_it(controller):
    said: list[str] = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = BackgroundServer(
            create_app(MemoryRunState("run"), ControlPlaneSection(), "run", token=""),
            "127.0.0.1",
            port,
            say=said.append,
        )
        server.start()
        assert not server.url.endswith(f":{port}")
        # one line naming who holds the port (this test's process) and how to choose another
        assert len(said) == 1 and f"127.0.0.1:{port} is in use by pid {os.getpid()} (" in said[0], said
        assert "control_plane.port" in said[0] and "STARE_CONTROL_PORT" in said[0]
        assert httpx.get(server.url + "/v1/health", timeout=5).json() == {"status": "ok"}
        server.stop()
    assert not server.thread.is_alive()
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/v1/health", timeout=2)


def test_ctl_entropy_changes_the_target_and_prints_the_audit_entry(served, capsys):
    server, state = served
    assert (
        main(["ctl", "--url", server.url, "--token", TOKEN, "entropy", "--target", "0.35", "--band", "0.3", "0.4"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["audit"]["new"] == {"target": 0.35, "band": [0.3, 0.4]}
    assert state.pending_entropy_changes()[0].who.endswith("(stare ctl) (127.0.0.1)")


def test_ctl_entropy_switches_the_adaptive_schedule(served, capsys):
    server, state = served
    args = ["entropy", "--adaptive", "--schedule", "proportional", "--gain", "5"]
    assert main(["ctl", "--url", server.url, "--token", TOKEN, *args]) == 0
    assert state.pending_entropy_changes()[0].new == {"adaptive": True, "schedule": "proportional", "gain": 5.0}


def test_ctl_prints_the_api_detail_and_exits_1_on_an_error(served, capsys):
    server, _ = served
    assert main(["ctl", "--url", server.url, "--token", "wrong", "pause"]) == 1
    assert "403 wrong API token" in capsys.readouterr().err
    assert main(["ctl", "--url", server.url, "--token", TOKEN, "entropy", "--w", "9"]) == 1
    assert "w: controller.w (9.0) must be <= controller.w_max" in capsys.readouterr().err


def test_ctl_reports_an_unreachable_url_and_exits_2(capsys):
    assert main(["ctl", "--url", f"http://127.0.0.1:{free_port()}", "--timeout-s", "2", "status"]) == 2
    assert "cannot reach the control plane" in capsys.readouterr().err


def test_ctl_history_prints_a_table_of_recent_steps(served, capsys):
    server, state = served
    for s in (1, 2, 3):
        state.append_metrics({"step": s, "entropy": 0.5 - s / 10, "target": 0.3})
    assert main(["ctl", "--url", server.url, "history", "--limit", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[0].split()[:3] == ["step", "entropy", "target"] and lines[-1].split()[0] == "3"


def test_stare_control_serves_the_redis_run_state(redis_url, controller):
    from stare.runstate.redis_state import RedisRunState

    learner_side = RedisRunState.connect(redis_url, "ctl-run")
    started(learner_side, controller)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stare.app.cli",
            "control",
            "--redis-url",
            redis_url,
            "--port",
            str(port),
            "--set",
            "run.name=ctl-run",
        ],
        env={**child_env(), "STARE_API_TOKEN": TOKEN},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/v1/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "stare control did not become ready"
            time.sleep(0.2)
        r = httpx.patch(
            url + "/v1/entropy", json={"target": 0.4}, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5
        )
        assert r.status_code == 202
        assert [e.new for e in learner_side.take_entropy_changes()] == [{"target": 0.4}]  # what the learner will take
    finally:
        proc.send_signal(2)
        out = proc.communicate(timeout=30)[0]
        learner_side.close()
    assert TOKEN not in out
