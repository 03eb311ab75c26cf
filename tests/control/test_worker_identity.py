"""Workers that leave, and workers that come back (old workers must not haunt the status): a role's
clean exit is a `gone` beat; a role that is not alive is listed until `forget_after_s` after its
last beat, then no longer (status, stare_role_up); `{slot}` names give each replica the lowest
free slot, so a redeployed replica takes its predecessor's name. Each test runs on both stores."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from services.control.app import create_app
from stare.config import ControlPlaneSection
from stare.runstate import Heartbeat, MemoryRunState
from stare.runtime.process import claim_slot


def beat(state, name: str, *, age_s: float = 0.0, gone: bool = False, host: str = "h1", role: str = "rollout"):
    state.beat(Heartbeat(role=role, name=name, pid=1, host=host, at=time.time() - age_s, gone=gone))


def listed(state) -> dict[str, bool]:
    return {r.name: r.alive for r in state.roles()}


def test_a_gone_worker_is_listed_not_alive_until_the_grace_then_forgotten(make_state):
    state = make_state(dead_after_s=15.0, forget_after_s=300.0)
    beat(state, "fresh-gone", age_s=1.0, gone=True)  # stopped 1 s ago: listed, not alive
    beat(state, "old-gone", age_s=301.0, gone=True)  # stopped 301 s ago: past the grace
    beat(state, "alive", age_s=1.0)
    assert listed(state) == {"fresh-gone": False, "alive": True}


def test_a_dead_worker_is_forgotten_after_the_grace_too(make_state):
    state = make_state(dead_after_s=15.0, forget_after_s=100.0)
    beat(state, "dead-recently", age_s=60.0)  # no beat for 60 s: dead, still within 100 s
    beat(state, "dead-long-ago", age_s=120.0)
    assert listed(state) == {"dead-recently": False}


def test_a_forgotten_heartbeat_is_deleted_from_redis(redis_state_factory):
    state = redis_state_factory(forget_after_s=100.0)
    beat(state, "ghost", age_s=120.0)
    assert state.client.hkeys(state._key("heartbeats")) == ["rollout/ghost"]
    assert state.roles() == []
    assert state.client.hkeys(state._key("heartbeats")) == []


def test_replicas_starting_together_take_slots_one_and_two(make_state):
    state = make_state()
    names = [claim_slot(state, "rollout", "rollout-cpu-{slot}", host=h, ttl_s=15.0) for h in ("c1", "c2")]
    assert names == ["rollout-cpu-1", "rollout-cpu-2"]  # no beat yet: the name reservation separates them


def test_a_redeployed_replica_takes_its_predecessors_name(make_state):
    state = make_state(dead_after_s=15.0)
    beat(state, "rollout-cpu-1", gone=True, host="old-1")  # `docker compose down`: both left
    beat(state, "rollout-cpu-2", gone=True, host="old-2")
    names = [claim_slot(state, "rollout", "rollout-cpu-{slot}", host=h, ttl_s=15.0) for h in ("new-a", "new-b")]
    assert names == ["rollout-cpu-1", "rollout-cpu-2"]


def test_a_live_worker_keeps_its_slot_and_a_restarted_container_gets_its_own_back(make_state):
    state = make_state(dead_after_s=15.0)
    beat(state, "reward-1", host="c1", role="reward")
    assert claim_slot(state, "reward", "reward-{slot}", host="c2", ttl_s=15.0) == "reward-2"
    # c1's process crashed and Docker restarted it in the same container (same hostname)
    assert claim_slot(state, "reward", "reward-{slot}", host="c1", ttl_s=15.0) == "reward-1"


def test_status_and_role_up_drop_a_worker_after_the_grace():
    state = MemoryRunState("run", dead_after_s=15.0, forget_after_s=300.0)
    beat(state, "rollout-old", age_s=400.0)  # a redeploy's predecessor, long gone
    beat(state, "rollout-now", age_s=1.0)
    beat(state, "rollout-left", age_s=5.0, gone=True)
    app = create_app(state, ControlPlaneSection(trusted_hosts=["testserver"]), "run", token="t")
    client = TestClient(app)
    roles = {r["name"]: (r["alive"], r["gone"]) for r in client.get("/v1/status").json()["roles"]}
    assert roles == {"rollout-now": (True, False), "rollout-left": (False, True)}
    up = [line for line in client.get("/metrics").text.splitlines() if line.startswith("stare_role_up{")]
    assert sorted(('name="rollout-now"' in line, line.endswith(" 1.0")) for line in up) == [
        (False, False),
        (True, True),
    ]
    assert not any("rollout-old" in line for line in up)


def test_a_role_that_stops_cleanly_says_it_is_gone(redis_url):
    from stare.config import build_config
    from stare.runstate.redis_state import RedisRunState
    from stare.runtime.process import RoleRuntime

    cfg = build_config({"run": {"name": "identity-exit"}, "system": {"health_port": 0, "heartbeat_s": 0.2}})
    state = RedisRunState.connect(redis_url, "identity-exit")
    state.client.delete(state._key("heartbeats"))
    with RoleRuntime("reward", "reward-1", cfg, redis_url):
        time.sleep(0.3)
        assert [(r.name, r.alive, r.gone) for r in state.roles()] == [("reward-1", True, False)]
    assert [(r.name, r.alive, r.gone) for r in state.roles()] == [("reward-1", False, True)]
    state.close()
