"""The control plane never answers 500 on stored state: a malformed entry in Redis (written by
something other than stare) is skipped with a warning naming its key, and the API answers; and
every reply carries the security headers, the outer layers' 400/403/413 too."""

from __future__ import annotations

import logging

import pytest
from control_helpers import AUTH, client, started
from redis_fixtures import have_redis_server

from services.control.security import CSP

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not have_redis_server(), reason="redis-server is not on PATH")]


def _push(state, name: str, raw: str) -> str:
    key = f"stare:{state.run_id}:{name}"
    state.client.rpush(key, raw)
    return key


@pytest.mark.parametrize("raw", ["{not json", '{"id": "x"}', "[]", "null"])
def test_a_malformed_pending_change_gives_200_on_get_and_patch_and_a_warning(
    redis_state_factory, controller, raw, caplog
):
    state = redis_state_factory()
    started(state, controller)
    key = _push(state, "entropy:pending", raw)
    api = client(state)
    with caplog.at_level(logging.WARNING, logger="stare.runstate.redis_state"):
        got = api.get("/v1/entropy")
        changed = api.patch("/v1/entropy", json={"target": 0.25}, headers=AUTH)
    assert got.status_code == 200 and got.json()["pending"] == []
    assert changed.status_code == 202 and [e["new"] for e in changed.json()["pending"]] == [{"target": 0.25}]
    assert any(f"skipped a malformed entry of {key}" in r.getMessage() for r in caplog.records)
    # the learner still takes it, as an entry it rejects and audits (unchanged behaviour)
    taken = state.take_entropy_changes()
    assert [e.error is not None for e in taken] == [True, False]


def test_malformed_heartbeat_metrics_and_controller_are_skipped(redis_state_factory, controller, caplog):
    state = redis_state_factory()
    started(state, controller)
    state.append_metrics({"step": 1, "loss": 0.5})
    _push(state, "metrics", "{broken")
    state.client.incr(f"stare:{state.run_id}:metrics:total")
    state.client.hset(f"stare:{state.run_id}:heartbeats", "rollout/x", "not a heartbeat")
    api = client(state)
    metrics = api.get("/v1/metrics/history")
    assert metrics.status_code == 200 and [m["step"] for m in metrics.json()["items"]] == [1]
    assert metrics.json()["next"] == 2  # past the skipped entry: a poller does not read it forever
    status = api.get("/v1/status")
    assert status.status_code == 200 and [r["role"] for r in status.json()["roles"]] == ["learner"]  # no rollout/x
    state.client.set(f"stare:{state.run_id}:controller", '{"config": 3}')
    assert api.get("/v1/entropy").status_code == 404  # as if none were published: no 500
    assert api.get("/metrics").status_code == 200  # Prometheus reads status, roles and metrics too
    assert len([r for r in caplog.records if "skipped a malformed entry" in r.getMessage()]) >= 3


def _has_headers(reply) -> bool:
    return (
        reply.headers.get("content-security-policy") == CSP
        and reply.headers.get("x-frame-options") == "DENY"
        and reply.headers.get("x-content-type-options") == "nosniff"
    )


def test_the_outer_layers_replies_carry_the_security_headers(redis_state_factory):
    from stare.runstate import MemoryRunState

    api = client(MemoryRunState("run"), max_body_bytes=1024)
    bad_host = api.get("/v1/health", headers={"Host": "evil.example"})
    cross_site = api.post("/v1/run/pause", headers={**AUTH, "Origin": "https://evil.example"})
    too_big = api.put("/v1/entropy", content=b"x" * 2048, headers={**AUTH, "Content-Type": "application/json"})
    ok = api.get("/v1/health")
    assert [r.status_code for r in (bad_host, cross_site, too_big, ok)] == [400, 403, 413, 200]
    assert all(_has_headers(r) for r in (bad_host, cross_site, too_big, ok))
