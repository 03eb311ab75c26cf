"""Every endpoint of the control plane, in process (ASGI), over the in-memory RunState."""

from __future__ import annotations

import json
import time

import pytest
from control_helpers import AUTH, client, started
from redis_fixtures import free_port

from stare.runstate import Heartbeat, MemoryRunState
from stare.runstate.redis_state import RedisRunState


@pytest.fixture
def state():
    return MemoryRunState("run")


def test_health_answers_ok(state):
    assert client(state).get("/v1/health").json() == {"status": "ok"}


def test_ready_is_200_when_the_store_answers_and_503_when_redis_is_down(state):
    assert client(state).get("/v1/ready").status_code == 200
    down = RedisRunState.connect(f"redis://127.0.0.1:{free_port()}/0", "run", socket_timeout_s=0.3)
    assert client(down).get("/v1/ready").status_code == 503


def test_a_store_outage_answers_503_with_the_reason():
    down = RedisRunState.connect(
        f"redis://127.0.0.1:{free_port()}/0", "run", socket_timeout_s=0.2, retries=2, op_timeout_s=1.0
    )
    r = client(down).get("/v1/status")
    assert r.status_code == 503 and "unavailable" in r.json()["detail"]


def test_status_before_any_learner_says_waiting(state):
    body = client(state).get("/v1/status").json()
    assert (body["run_id"], body["phase"], body["roles"], body["paused"]) == ("run", "waiting", [], False)


def test_status_shows_the_learner_s_fields_and_role_liveness(state, controller):
    control = started(state, controller)
    control.after_step(
        controller,
        {"step": 1, "weight_version": 1},
        {"tokens_per_s": 50.0, "queue_depths": {"raw": 3}, "staleness": {"max": 1, "counts": {"0": 6, "1": 2}}},
    )
    state.beat(Heartbeat(role="rollout", name="r0", pid=5, host="h", at=time.time() - 60))  # dead, not yet forgotten
    body = client(state).get("/v1/status").json()
    assert (body["phase"], body["step"], body["weight_version"], body["tokens_per_s"]) == ("training", 1, 1, 50.0)
    assert body["queue_depths"] == {"raw": 3} and body["staleness"]["counts"] == {"0": 6, "1": 2}
    assert {(r["name"], r["alive"]) for r in body["roles"]} == {("learner-0", True), ("r0", False)}


def test_entropy_is_404_until_the_learner_publishes_it(state):
    r = client(state).get("/v1/entropy")
    assert r.status_code == 404 and "learner publishes" in r.json()["detail"]


def test_entropy_shows_the_controller_and_the_pending_changes(state, controller):
    started(state, controller)
    api = client(state)
    assert api.patch("/v1/entropy", json={"target": 0.4}, headers=AUTH).status_code == 202
    body = api.get("/v1/entropy").json()
    assert (body["target"], body["band"], body["gate"], body["w"], body["m"], body["adaptive"]) == (
        0.3,
        None,
        False,
        1.1,
        0.9,
        False,
    )
    assert [p["new"] for p in body["pending"]] == [{"target": 0.4}]


def test_put_sets_target_and_removes_the_band_when_absent(state, controller):
    controller.reconfigure(band=(0.2, 0.4))
    started(state, controller)
    r = client(state).put("/v1/entropy", json={"target": 0.35}, headers=AUTH)
    assert r.status_code == 202
    assert (r.json()["audit"]["old"], r.json()["audit"]["new"]) == (
        {"target": 0.3, "band": [0.2, 0.4]},
        {"target": 0.35, "band": None},
    )


def test_patch_changes_only_the_given_fields(state, controller):
    controller.reconfigure(band=(0.2, 0.4))
    started(state, controller)
    r = client(state).patch("/v1/entropy", json={"adaptive": True, "alpha": 0.05}, headers=AUTH)
    assert r.json()["audit"]["new"] == {"adaptive": True, "alpha": 0.05}


def test_a_change_without_a_learner_is_409(state):
    r = client(state).patch("/v1/entropy", json={"target": 0.4}, headers=AUTH)
    assert r.status_code == 409 and "learner" in r.json()["detail"]


def test_audit_names_the_actor_header(state, controller):
    started(state, controller)
    api = client(state)
    api.patch("/v1/entropy", json={"target": 0.4}, headers={**AUTH, "X-Stare-Actor": "alice"})
    entries = api.get("/v1/entropy/audit").json()
    assert entries[0]["who"].startswith("alice") and entries[0]["applied_step"] is None


def test_history_pages_by_index(state):
    for s in range(1, 6):
        state.append_metrics({"step": s})
    page = client(state).get("/v1/metrics/history", params={"offset": 1, "limit": 2}).json()
    assert ([i["step"] for i in page["items"]], page["next"], page["total"]) == ([2, 3], 3, 5)


def test_stream_sends_each_entry_after_the_last_event_id(state):
    for s in range(1, 4):
        state.append_metrics({"step": s})
    with client(state).stream(
        "GET", "/v1/metrics/stream", params={"limit_s": 0.3}, headers={"Last-Event-ID": "0"}
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [e for e in r.read().decode().split("\n\n") if e.startswith("id:")]
    parsed = [(int(e.split("\n")[0][4:]), json.loads(e.split("\n")[2][6:])["step"]) for e in events]
    assert parsed == [(1, 2), (2, 3)]


@pytest.mark.parametrize("command, paused, checkpoint", [("pause", True, False), ("checkpoint", False, True)])
def test_run_commands_set_the_flags(state, command, paused, checkpoint):
    r = client(state).post(f"/v1/run/{command}", headers=AUTH)
    assert r.status_code == 202 and (r.json()["paused"], r.json()["checkpoint_requested"]) == (paused, checkpoint)
    assert (state.paused(), state.checkpoint_requested()) == (paused, checkpoint)


def test_resume_clears_a_pause(state):
    state.set_paused(True)
    assert client(state).post("/v1/run/resume", headers=AUTH).json()["paused"] is False
    assert state.paused() is False


def test_prometheus_exposes_the_last_step_queues_and_roles(state, controller):
    from prometheus_client.parser import text_string_to_metric_families

    control = started(state, controller)
    control.after_step(
        controller,
        {
            "step": 4,
            "weight_version": 4,
            "entropy": 0.25,
            "target": 0.3,
            "gate": 1,
            "reward_mean": 0.5,
            "time_step_s": 1.5,
        },
        {"queue_depths": {"scored": 7}},
    )
    r = client(state).get("/metrics")
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(r.text)
        for s in f.samples
    }
    run = (("run_id", "run"),)
    for (name, labels), value in {
        ("stare_entropy", ()): 0.25,
        ("stare_entropy_target", ()): 0.3,
        ("stare_gate", ()): 1.0,
        ("stare_reward_mean", ()): 0.5,
        ("stare_step_time_seconds", ()): 1.5,
        ("stare_weight_version", ()): 4.0,
        ("stare_queue_depth", (("queue", "scored"),)): 7.0,
        ("stare_role_up", (("name", "learner-0"), ("role", "learner"))): 1.0,
    }.items():
        assert samples[(name, tuple(sorted(run + labels)))] == value, name


def test_dashboard_page_and_assets_are_served_without_external_urls(state):
    api = client(state)
    page = api.get("/")
    assert page.status_code == 200 and "<canvas" in page.text
    js = api.get("/static/dashboard.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    for text in (page.text, js.text, api.get("/static/dashboard.css").text):
        assert "http://" not in text and "https://" not in text
    assert api.get("/static/other.js").status_code == 404


def test_openapi_documents_every_v1_endpoint(state):
    paths = set(client(state).get("/openapi.json").json()["paths"])
    assert paths == {
        "/v1/health",
        "/v1/ready",
        "/v1/status",
        "/v1/entropy",
        "/v1/entropy/audit",
        "/v1/metrics/history",
        "/v1/metrics/stream",
        "/v1/run/pause",
        "/v1/run/resume",
        "/v1/run/checkpoint",
        "/v1/run/audit",
        "/metrics",
    }
