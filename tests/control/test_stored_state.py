"""The control plane never answers a bare 500 on stored state: a malformed entry in Redis (written
by something other than stare: not JSON, not UTF-8, a field of the wrong type) is skipped or left out
with a warning naming its key, and the API answers; a key of another Redis type or a published
controller that does not validate is a 500 whose detail names the key and the fix. Every reply
carries the security headers, the outer layers' 400/403/413 too."""

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


def test_bytes_that_are_not_utf8_are_read_not_a_500(redis_state_factory, controller):
    state = redis_state_factory()
    started(state, controller)
    raw, run = state.client, state.run_id
    raw.set(f"stare:{run}:status", b'{"phase": "tr\xffaining", "step": 4}')
    raw.hset(f"stare:{run}:heartbeats", "rollout/x", b"\xff\xfe")
    raw.rpush(f"stare:{run}:entropy:audit", b"\xff\xfe")
    raw.rpush(f"stare:{run}:metrics", b"\xff")
    raw.incr(f"stare:{run}:metrics:total")
    api = client(state)
    status = api.get("/v1/status", headers=AUTH)
    assert status.status_code == 200, status.text
    assert (status.json()["phase"], status.json()["step"]) == ("tr\ufffdaining", 4)  # replaced, not refused
    assert [r["name"] for r in status.json()["roles"]] == ["learner-0"]  # the undecodable beat skipped
    audit = api.get("/v1/entropy/audit", headers=AUTH)
    assert audit.status_code == 200 and audit.json()[-1]["who"] == "unknown (a malformed pending entry in the store)"
    assert api.get("/v1/metrics/history").status_code == 200
    assert api.get("/metrics").status_code == 200


def test_a_wrong_typed_status_field_is_left_out_with_a_warning(redis_state_factory, controller, caplog):
    state = redis_state_factory()
    started(state, controller)
    state.client.set(
        f"stare:{state.run_id}:status", '{"phase": 3, "step": "abc", "queue_depths": [1], "tokens_per_s": 12.5}'
    )
    api = client(state)
    with caplog.at_level(logging.WARNING, logger="services.control.schemas"):
        view = api.get("/v1/status")
        scraped = api.get("/metrics")
    assert view.status_code == 200, view.text
    body = view.json()
    assert (body["phase"], body["step"], body["queue_depths"], body["tokens_per_s"]) == ("unknown", None, {}, 12.5)
    assert scraped.status_code == 200 and "stare_queue_depth" not in scraped.text
    left_out = {r.getMessage().split(" holds ")[0] for r in caplog.records if "left out" in r.getMessage()}
    assert {"run state: status.phase", "run state: status.step", "run state: status.queue_depths"} <= left_out


@pytest.mark.parametrize(
    ("path", "key", "kind"),
    [("/v1/status", "status", "list"), ("/v1/status", "heartbeats", "str"), ("/v1/metrics/history", "metrics", "str")],
)
def test_a_key_of_another_redis_type_is_a_500_naming_the_fix(redis_state_factory, controller, path, key, kind):
    state = redis_state_factory()
    started(state, controller)
    full = f"stare:{state.run_id}:{key}"
    state.client.delete(full)
    state.client.rpush(full, "x") if kind == "list" else state.client.set(full, "x")
    answer = client(state).get(path, headers=AUTH)
    assert answer.status_code == 500
    detail = answer.json()["detail"]
    assert "found a key of another Redis type under stare:" in detail and "WRONGTYPE" in detail
    assert f"redis-cli --scan --pattern 'stare:{state.run_id}:*'" in detail


def test_a_counter_that_is_not_a_number_is_a_500_naming_the_key(redis_state_factory, controller):
    state = redis_state_factory()
    started(state, controller)
    state.client.set(f"stare:{state.run_id}:metrics:total", "abc")
    answer = client(state).get("/v1/metrics/history")
    assert answer.status_code == 500
    assert answer.json()["detail"] == (
        f"run state: stare:{state.run_id}:metrics:total holds 'abc', not a count; something other than stare "
        f"wrote it: redis-cli DEL stare:{state.run_id}:metrics:total (it restarts at 0)"
    )


def test_a_published_controller_that_does_not_validate_is_a_500_naming_the_field(redis_state_factory, controller):
    state = redis_state_factory()
    started(state, controller)
    state.client.set(f"stare:{state.run_id}:controller", '{"config": {"target": "abc"}, "gate": true}')
    answer = client(state).get("/v1/entropy")
    assert answer.status_code == 500
    assert answer.json()["detail"].startswith(
        "run state: the learner's published controller does not validate: target: Input should be a valid number"
    )
