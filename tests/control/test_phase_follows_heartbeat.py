"""GET /v1/status's phase follows the learner's heartbeat: the phase the learner wrote (training,
paused, starting) stands while a learner role is alive and reads "down", with the reason and what to
do, once none has beaten for system.dead_after_s; finished, stopped and failed stand whatever the
heartbeat. Each role reads alive, down (no heartbeat) or gone (stopped cleanly); `stare ctl status`
says on stderr what is down. The bound on real processes: a learner role process SIGKILLed reads
down between dead_after_s - heartbeat_s and dead_after_s after it died (13-15 s at the defaults)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
from control_helpers import AUTH, client

from stare.config import ConfigError, build_config
from stare.runstate import Heartbeat, RunSteering
from stare.runstate.base import effective_phase, role_health


def beat(state, name: str = "learner", *, role: str = "learner", age_s: float = 0.0, gone: bool = False) -> None:
    state.beat(Heartbeat(role=role, name=name, pid=1, host="h", at=time.time() - age_s, gone=gone))


@pytest.mark.parametrize("phase", ["training", "paused", "starting"])
def test_an_active_phase_stands_while_the_learner_beats_and_is_down_after_dead_after_s(make_state, phase):
    state = make_state(dead_after_s=15.0)
    api = client(state)
    state.set_status({"phase": phase, "step": 42})
    beat(state, age_s=13.0)  # two seconds before dead_after_s
    assert api.get("/v1/status").json()["phase"] == phase
    beat(state, age_s=16.0)
    view = api.get("/v1/status").json()
    assert (view["phase"], view["last_phase"]) == ("down", phase)
    assert view["reason"].startswith("no heartbeat from learner learner for 16.")
    assert "s (system.dead_after_s 15 s); " in view["reason"]
    assert f"it last said {phase} at step 42; start it again (compose: docker compose up -d" in view["reason"]
    assert [(r["name"], r["alive"], r["state"]) for r in view["roles"]] == [("learner", False, "down")]


@pytest.mark.parametrize("phase", ["finished", "stopped", "failed", "waiting"])
def test_a_phase_after_the_run_stands_without_a_heartbeat(make_state, phase):
    state = make_state(dead_after_s=15.0)
    state.set_status({"phase": phase, "step": 7})
    beat(state, age_s=100.0)
    view = client(state).get("/v1/status").json()
    assert (view["phase"], view.get("last_phase")) == (phase, None)


def test_a_learner_that_left_cleanly_mid_run_or_was_forgotten_is_down(make_state):
    state = make_state(dead_after_s=15.0, forget_after_s=300.0)
    state.set_status({"phase": "training", "step": 3})
    beat(state, age_s=2.0, gone=True)
    view = client(state).get("/v1/status").json()
    assert view["phase"] == "down"
    assert re.match(
        r"learner learner's last heartbeat, [2-9] s ago, said it stopped; it last said training", view["reason"]
    )
    assert view["roles"][0]["state"] == "gone"
    beat(state, age_s=400.0)  # older than forget_after_s: no longer listed
    view = client(state).get("/v1/status").json()
    assert view["phase"] == "down" and view["roles"] == []
    assert view["reason"].startswith("no learner heartbeat is listed")


def test_another_roles_heartbeat_does_not_keep_the_learner_up(make_state):
    state = make_state(dead_after_s=15.0)
    state.set_status({"phase": "training"})
    beat(state, "rollout-1", role="rollout")
    beat(state, "learner", age_s=30.0)
    assert client(state).get("/v1/status").json()["phase"] == "down"
    beat(state, "learner-2", age_s=1.0)  # a learner restarted under another name is alive
    assert client(state).get("/v1/status").json()["phase"] == "training"


def test_role_states_by_hand():
    now = 1000.0
    states = [
        role_health(Heartbeat(role="r", name="a", pid=1, host="h", at=now - age, gone=gone), 15.0, now).state
        for age, gone in [(0.0, False), (14.9, False), (15.0, False), (1.0, True)]
    ]
    assert states == ["alive", "alive", "down", "gone"]
    assert effective_phase({"phase": "training"}, [], 15.0)["phase"] == "down"
    assert effective_phase({}, [], 15.0) == {}  # nothing written: the route says waiting


def test_the_embedded_train_beats_between_steps(controller):
    """`stare train`'s steering beats from a thread: a step longer than dead_after_s is not down."""
    from stare.runstate import MemoryRunState

    state = MemoryRunState("run", dead_after_s=0.6)
    steering = RunSteering(state, heartbeat_s=0.1)
    steering.start(controller)
    with steering.beating():
        time.sleep(1.2)  # two dead_after_s without a step boundary
        assert [r.state for r in state.roles()] == ["alive"]
    time.sleep(0.8)
    assert [r.state for r in state.roles()] == ["down"]  # the thread stopped with the block


def test_dead_after_s_must_span_two_heartbeats():
    with pytest.raises(ConfigError, match=r"system.dead_after_s 3 is under 2 x system.heartbeat_s 2"):
        build_config({"system": {"dead_after_s": 3.0}})
    assert build_config({"system": {"dead_after_s": 4.0}}).system.dead_after_s == 4.0


def test_ctl_status_says_what_is_down(capsys):
    from stare.app.cli.ctl import down_lines

    view = {
        "phase": "down",
        "reason": "no heartbeat from learner learner for 16.0 s",
        "roles": [
            {"role": "learner", "name": "learner", "age_s": 16.04, "host": "c0ffee", "state": "down"},
            {"role": "rollout", "name": "rollout-cpu-1", "age_s": 1.0, "host": "b", "state": "alive"},
            {"role": "reward", "name": "reward-cpu-1", "age_s": 20.0, "host": "d", "state": "gone"},
        ],
    }
    assert down_lines(view) == [
        "phase down: no heartbeat from learner learner for 16.0 s",
        "learner/learner down: no heartbeat for 16 s (host c0ffee)",
    ]


# -- real processes: a learner role's own heartbeat thread, SIGKILLed; the control plane over HTTP ----------

LEARNER = """
import sys, threading
from stare.config import build_config
from stare.runtime.process import RoleRuntime
cfg = build_config({"run": {"name": sys.argv[2]}, "system": {"heartbeat_s": 0.2, "dead_after_s": 2.0}})
with RoleRuntime("learner", "learner", cfg, sys.argv[1]) as rt:
    rt.steering.set_phase("training", step=5)
    print("up", flush=True)
    threading.Event().wait()
"""


@pytest.mark.slow
def test_a_killed_learner_process_reads_down_within_dead_after_s(redis_url, tmp_path):
    from services.control.app import create_app
    from services.control.server import BackgroundServer
    from stare.config import ControlPlaneSection
    from stare.runstate.redis_state import RedisRunState

    run = f"phase-{os.getpid()}"
    state = RedisRunState.connect(redis_url, run, dead_after_s=2.0)
    server = BackgroundServer(create_app(state, ControlPlaneSection(), run, token="t"), "127.0.0.1", 0).start()

    def phase() -> str:
        return httpx.get(f"{server.url}/v1/status", headers=AUTH, timeout=5).json()["phase"]

    def learner() -> subprocess.Popen:
        child = subprocess.Popen([sys.executable, "-c", LEARNER, redis_url, run], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "up"
        return child

    child = learner()
    try:
        assert phase() == "training"
        time.sleep(0.5)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        killed = time.monotonic()
        time.sleep(0.5)
        assert phase() == "training"  # it follows the heartbeat's age, not a guess: 0.5 s < 2.0 - 0.2
        while phase() != "down":
            assert time.monotonic() - killed < 2.0 + 1.0, "not down within dead_after_s (+1 s for a loaded machine)"
            time.sleep(0.05)
        took = time.monotonic() - killed
        print(f"down {took:.2f} s after SIGKILL (dead_after_s 2.0, heartbeat_s 0.2)")
        assert took >= 2.0 - 0.2 - 0.3  # the last beat came at most heartbeat_s before the kill
        child = learner()  # restarted (compose: up -d): its first beat is the phase's
        assert phase() == "training"
    finally:
        child.kill()
        child.wait(timeout=10)
        server.stop()
        state.close()
