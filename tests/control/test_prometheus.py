"""GET /metrics through prometheus-client, scraped over real HTTP and parsed with the client's own
parsers: the last step's gauges, the names dashboards query, histograms accumulated over the history
(once per entry, across scrapes), dead letters, redeliveries, role liveness, one registry per run
state, OpenMetrics on request; both RunState implementations."""

from __future__ import annotations

import time

import httpx
import pytest
from control_helpers import TOKEN, started
from prometheus_client import REGISTRY
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from services.control.app import create_app
from services.control.prometheus import LEGACY_NAMES, STEP_TIME_BUCKETS, SYNC_TIME_BUCKETS
from services.control.server import BackgroundServer
from stare.config import ControlPlaneSection
from stare.runstate.base import Heartbeat

FULL_STEP = {
    "step": 1,
    "weight_version": 1,
    "entropy": 0.41,
    "target": 0.3,
    "band_low": 0.2,
    "band_high": 0.5,
    "gate": 0,
    "w": 1.5,
    "m": 0.8,
    "reward_mean": 0.25,
    "accuracy": 0.25,
    "response_length_mean": 12.5,
    "time_step_s": 0.7,
    "tokens_per_s": 900.0,
    "staleness_max": 1,
    "staleness_mean": 0.5,
    "time_learn_s": 0.4,
    "time_plan_s": 0.01,
    "time_wait_data_s": 0.2,
    "time_publish_s": 0.03,
    "eval_greedy_accuracy": 0.375,
    "clip_fraction_low": 0.01,
    "clip_fraction_high": 0.02,
    "approx_kl": 0.003,
    "rollout_mismatch_k1": -0.002,
    "rollout_mismatch_k3": 0.004,
    "rollout_masked_fraction": 0.05,
    "rollout_truncated_fraction": 0.06,
}
FULL_STATUS = {
    "queue_depths": {"prompts": 3, "raw": 2, "scored": 5},
    "dead_letters": {"raw": 4, "scored": 0},
    "staleness": {"max": 1, "counts": {"0": 6, "1": 2}},
}


@pytest.fixture
def state(make_state):
    return make_state()


@pytest.fixture
def serve():
    servers = []

    def start(state, run_id="run"):
        server = BackgroundServer(create_app(state, ControlPlaneSection(), run_id, token=TOKEN), "127.0.0.1", 0).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def scrape(server, **headers) -> httpx.Response:
    r = httpx.get(server.url + "/metrics", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    return r


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels without run_id) -> value; every sample must carry run_id."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = dict(s.labels)
            assert labels.pop("run_id") == "run", s
            out[(s.name, tuple(sorted(labels.items())))] = s.value
    return out


def types(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_the_last_steps_gauges_are_its_metrics(state, controller, serve):
    control = started(state, controller)
    control.after_step(controller, {k: v for k, v in FULL_STEP.items() if k != "time_plan_s"}, FULL_STATUS)
    got = samples(scrape(serve(state)).text)
    for key, name in [
        ("entropy", "stare_entropy"),
        ("target", "stare_entropy_target"),
        ("w", "stare_w"),
        ("band_low", "stare_entropy_band_low"),
        ("tokens_per_s", "stare_tokens_per_second"),
        ("response_length_mean", "stare_response_length_mean"),
        ("staleness_max", "stare_staleness_max"),
        ("clip_fraction_low", "stare_clip_fraction_low"),
        ("approx_kl", "stare_approx_kl"),
        ("rollout_mismatch_k1", "stare_rollout_mismatch_k1"),
        ("rollout_mismatch_k3", "stare_rollout_mismatch_k3"),
        ("rollout_masked_fraction", "stare_rollout_masked_fraction"),
        ("rollout_truncated_fraction", "stare_rollout_truncated_fraction"),
    ]:
        assert got[(name, ())] == FULL_STEP[key], name
    assert got[("stare_step_phase_seconds", (("phase", "learn"),))] == 0.4
    assert got[("stare_step_phase_seconds", (("phase", "wait_data"),))] == 0.2
    assert ("stare_step_phase_seconds", (("phase", "plan"),)) not in got  # not logged: no sample
    assert got[("stare_queue_depth", (("queue", "scored"),))] == 5
    assert got[("stare_dead_letters", (("stream", "raw"),))] == 4
    assert got[("stare_staleness", (("lag", "1"),))] == 2
    assert got[("stare_eval_greedy_accuracy", ())] == 0.375 and got[("stare_eval_step", ())] == 1


def test_every_name_of_the_hand_written_exposition_is_still_exported(state, controller, serve):
    """Dashboards built on the old /metrics keep working: same names, same types, same help."""
    control = started(state, controller)
    control.after_step(controller, dict(FULL_STEP), FULL_STATUS)
    text = scrape(serve(state)).text
    assert {n: types(text).get(n) for n in LEGACY_NAMES} == dict.fromkeys(LEGACY_NAMES, "gauge")
    help_of = {f.name: f.documentation for f in text_string_to_metric_families(text)}
    assert help_of["stare_entropy"] == "Batch-mean token entropy of the last step (nats)"
    assert help_of["stare_queue_depth"] == "Entries published and not yet acknowledged, per stream"
    assert help_of["stare_role_up"] == "1 while the role's heartbeat is fresh"


def _bucket_counts(got: dict, name: str, buckets: tuple[float, ...], values: list[float]) -> None:
    for le in buckets:
        label = "+Inf" if le == float("inf") else repr(float(le))
        assert got[(f"{name}_bucket", (("le", label),))] == sum(v <= le for v in values), (name, le)
    assert got[(f"{name}_count", ())] == len(values)
    assert got[(f"{name}_sum", ())] == pytest.approx(sum(values), rel=1e-12)


def test_histograms_count_each_step_once_across_scrapes(state, controller, serve):
    control = started(state, controller)
    server = serve(state)
    times, syncs = [0.05, 0.3, 0.3, 7.0], [0.004, 0.2]
    for step, t in enumerate(times[:2], start=1):
        control.after_step(controller, {"step": step, "time_step_s": t, "time_publish_s": syncs[step - 1]})
    first = samples(scrape(server).text)
    _bucket_counts(first, "stare_step_duration_seconds", STEP_TIME_BUCKETS, times[:2])
    samples(scrape(server).text)  # a scrape with nothing new adds nothing
    for step, t in enumerate(times[2:], start=3):
        control.after_step(controller, {"step": step, "time_step_s": t})  # the embedded learner logs no publish time
    got = samples(scrape(server).text)
    _bucket_counts(got, "stare_step_duration_seconds", STEP_TIME_BUCKETS, times)
    _bucket_counts(got, "stare_weight_sync_duration_seconds", SYNC_TIME_BUCKETS, syncs)
    assert types(scrape(server).text)["stare_step_duration_seconds"] == "histogram"


def test_a_replica_started_late_counts_the_whole_kept_history(state, controller, serve):
    control = started(state, controller)
    for step in range(1, 1202):  # more than one page of history
        state.append_metrics({"step": step, "time_step_s": 0.2 if step % 2 else 20.0})
    control.after_step(controller, {"step": 1202, "time_step_s": 0.2})
    got = samples(scrape(serve(state)).text)
    assert got[("stare_step_duration_seconds_count", ())] == 1202
    assert got[("stare_step_duration_seconds_bucket", (("le", "0.25"),))] == 602
    assert got[("stare_step", ())] == 1202


def test_role_liveness_and_redeliveries_come_from_the_heartbeats(state, serve):
    state.beat(Heartbeat(role="rollout", name="rollout-1", pid=1, host="h", info={"redelivered": 3}))
    state.beat(Heartbeat(role="reward", name="reward-0", pid=2, host="h", info={"redelivered": 0}))
    # dead for 2 min: within system.forget_after_s (300 s), so still listed, as down
    state.beat(Heartbeat(role="learner", name="learner", pid=3, host="h", at=time.time() - 120))
    text = scrape(serve(state)).text
    got = samples(text)
    assert got[("stare_role_up", (("name", "rollout-1"), ("role", "rollout")))] == 1
    assert got[("stare_role_up", (("name", "learner"), ("role", "learner")))] == 0
    assert 120 <= got[("stare_role_heartbeat_age_seconds", (("name", "learner"), ("role", "learner")))] < 180
    assert got[("stare_redeliveries_total", (("name", "rollout-1"), ("role", "rollout")))] == 3
    assert got[("stare_redeliveries_total", (("name", "reward-0"), ("role", "reward")))] == 0
    assert ("stare_redeliveries_total", (("name", "learner"), ("role", "learner"))) not in got
    assert types(text)["stare_redeliveries"] == "counter"


def test_each_run_state_has_its_own_registry(make_state, controller, serve):
    a, b = make_state(), make_state()
    started(a, controller).after_step(controller, {"step": 1, "entropy": 0.1, "time_step_s": 1.0})
    started(b, controller).after_step(controller, {"step": 1, "entropy": 0.9, "time_step_s": 1.0})
    assert samples(scrape(serve(a)).text)[("stare_entropy", ())] == 0.1
    assert samples(scrape(serve(b)).text)[("stare_entropy", ())] == 0.9
    assert not any(name.startswith("stare_") for name in REGISTRY._names_to_collectors)


def test_openmetrics_is_served_when_the_scraper_asks(state, controller, serve):
    started(state, controller).after_step(controller, {"step": 2, "entropy": 0.5, "time_step_s": 1.0})
    r = scrape(serve(state), accept="application/openmetrics-text; version=1.0.0; charset=utf-8")
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    families = {f.name: f for f in openmetrics_families(r.text)}
    assert families["stare_entropy"].samples[0].value == 0.5
    assert families["stare_step_duration_seconds"].type == "histogram"


def test_metrics_need_the_token_when_reads_are_authenticated(state, serve):
    server = BackgroundServer(
        create_app(state, ControlPlaneSection(auth_reads=True), "run", token=TOKEN), "127.0.0.1", 0
    )
    server.start()
    try:
        assert httpx.get(server.url + "/metrics", timeout=10).status_code == 401
        r = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert r.status_code == 200 and "stare_paused" in r.text
    finally:
        server.stop()
