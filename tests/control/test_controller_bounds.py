"""Controller values are finite, strictly typed and inside their physical ranges wherever they enter:
the API (422, through a real server), the store (a change written to Redis directly is rejected by
the learner and audited, the run goes on), a checkpoint, the config. Non-finite steps are counted."""

from __future__ import annotations

import json
import math

import httpx
import pytest
from control_helpers import AUTH, TOKEN, client, started

from learner.algorithm.entropy_controller import EntropyController
from learner.step.trainer import nonfinite_step
from services.control.app import create_app
from services.control.server import BackgroundServer
from stare.config import ConfigError, ControlPlaneSection, build_config
from stare.config.algo import ControllerConfig
from stare.runstate import MemoryRunState, RunSteering

LN_V = 4.0  # the max_entropy the fake learner publishes

BAD_BODIES = [
    {"target": 1e308},
    {"target": True},
    {"target": "0.3"},
    {"target": 0},
    {"target": -1.0},
    {"target": LN_V + 0.1},
    {"w": 1e308},
    {"w": 0.5},
    {"w": "1.2"},
    {"w_max": 11},
    {"w": 1.4, "w_max": 1.2},
    {"m": 0},
    {"m": 1.5},
    {"m_min": 0},
    {"alpha": 2.0},
    {"alpha": -0.1},
    {"gain": 1e6},
    {"gain": False},
    {"band": [0.1, 1e308]},
    {"band": [0.1, True]},
    {"band": [0.5, 0.2]},
    {"band": [0.1, LN_V + 1]},
    {"band": 5},
    {"adaptive": "true"},
    {"adaptive": 1},
    {"schedule": "pid"},
]
RAW_BODIES = [b'{"target": NaN}', b'{"target": Infinity}', b'{"w": -Infinity}', b'{"band": [0.1, Infinity]}']


@pytest.fixture(scope="module")
def api():
    state = MemoryRunState("run")
    started(state, EntropyController(ControllerConfig(), max_entropy=LN_V))
    server = BackgroundServer(create_app(state, ControlPlaneSection(), "run", token=TOKEN), "127.0.0.1", 0).start()
    yield state, server.url
    server.stop()


@pytest.mark.parametrize("body", BAD_BODIES, ids=lambda b: json.dumps(b))
def test_an_out_of_range_or_loosely_typed_value_is_422(api, body):
    state, url = api
    r = httpx.patch(url + "/v1/entropy", json=body, headers=AUTH, timeout=5)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"].split(".")[0] in body
    assert state.pending_entropy_changes() == []


@pytest.mark.parametrize("raw", RAW_BODIES, ids=lambda b: b.decode())
def test_a_non_finite_value_is_422(api, raw):
    state, url = api
    r = httpx.patch(url + "/v1/entropy", content=raw, headers={**AUTH, "Content-Type": "application/json"}, timeout=5)
    assert r.status_code == 422 and "finite" in r.text
    assert state.pending_entropy_changes() == []


def test_the_reported_attack_body_is_422(api):
    state, url = api
    body = {"target": 1e308, "w": 1e308, "w_max": 1e308, "adaptive": False}
    assert httpx.put(url + "/v1/entropy", json=body, headers=AUTH, timeout=5).status_code == 422
    assert state.pending_entropy_changes() == []


def test_values_at_the_edges_of_the_ranges_are_accepted(api):
    state, url = api
    body = {"target": LN_V, "band": [1e-6, LN_V], "w": 10, "w_max": 10, "m": 1, "m_min": 1e-6, "alpha": 1, "gain": 1000}
    r = httpx.patch(url + "/v1/entropy", json=body, headers=AUTH, timeout=5)
    assert r.status_code == 202, r.text
    state.take_entropy_changes()


FORGED = [  # written to the pending list directly, as anyone with Redis access could
    '{"id": 900, "who": "mallory", "when": 0, "old": {}, "new": {"w": Infinity}}',
    '{"id": 901, "who": "mallory", "when": 0, "old": {}, "new": {"target": 1e308, "w_max": 1e308}}',
    '{"id": 902, "who": "mallory", "when": 0, "old": {}, "new": {"adaptive": "true"}}',
    '{"id": 903, "who": "mallory", "when": 0, "old": {}, "new": {"band": 5}}',
    '{"id": 904, "who": "mallory", "when": 0, "old": {}, "new": {"no_such_field": 1}}',
    '{"id": 905, "who": "mallory", "when": 0, "old": {}, "new": {"target": 3.9}}',  # above ln V
    "not json at all",
    '{"id": "x"}',
]


def _forge(state, entries: list[str]) -> None:
    state.client.rpush(f"stare:{state.run_id}:entropy:pending", *entries)


def test_a_change_forged_in_redis_is_rejected_audited_and_the_run_goes_on(redis_state_factory):
    state = redis_state_factory()
    controller = EntropyController(ControllerConfig(), max_entropy=math.log(40))
    control = started(state, controller)
    before = controller.state_dict()
    _forge(state, FORGED)
    directives = control.before_step(controller)
    assert directives.applied == [] and controller.state_dict() == before
    audit = state.audit()
    assert len(audit) == len(FORGED)
    assert all(e.error.startswith("not applied") and e.applied_step == 1 for e in audit)
    assert all("not from the control plane" in e.who for e in audit)
    assert "finite" in audit[0].error and "ln V" in audit[5].error
    with client(state) as api:  # the API still reads the controller and takes valid changes
        assert api.get("/v1/entropy").status_code == 200
        assert api.patch("/v1/entropy", json={"target": 0.5}, headers=AUTH).status_code == 202
    assert [e.new for e in control.before_step(controller).applied] == [{"target": 0.5}]
    control.after_step(controller, {"step": 1, "loss": 0.1})


def test_a_rejected_api_change_is_marked_on_its_own_audit_entry(make_state):
    state = make_state()
    controller = EntropyController(ControllerConfig(w=1.1, w_max=1.5))
    control = started(state, controller)
    entry = state.request_entropy_change({"w": 1.4}, "alice")
    controller.reconfigure(w_max=1.2)  # the bound moved after the API validated the change
    control.before_step(controller)
    [audited] = state.audit()
    assert audited.id == entry.id and audited.who == "alice" and audited.error.startswith("not applied")


def test_a_checkpoint_with_values_outside_the_ranges_is_refused():
    good = EntropyController(ControllerConfig()).state_dict()
    for bad in ({"w": math.inf}, {"w_max": 1e308}, {"target": 5.0}, {"adaptive": "yes"}):
        controller = EntropyController(ControllerConfig(), max_entropy=math.log(40))
        with pytest.raises(ValueError, match="controller"):
            controller.load_state_dict({**good, "config": {**good["config"], **bad}})


def test_a_starting_target_above_ln_v_is_lowered_to_it():
    controller = EntropyController(ControllerConfig(target=5.0, band=(1.0, 6.0)), max_entropy=math.log(19))
    assert controller.target == controller.band[1] == pytest.approx(math.log(19)) and controller.band[0] == 1.0


@pytest.mark.parametrize(
    "override", ["controller.w=1e308", "controller.alpha=5", "controller.target=.nan", "controller.adaptive=maybe"]
)
def test_the_config_refuses_values_outside_the_ranges(override):
    with pytest.raises(ConfigError, match=override.split("=")[0].split(".")[1]):
        build_config({}, overrides=[override])


def test_non_finite_steps_are_counted_and_shown_in_status_metrics_and_prometheus():
    assert [
        nonfinite_step(*args, step=1)
        for args in [(0.5, 1.0), (math.nan, 1.0), (0.5, math.inf), (0.5, None), (-math.inf, None)]
    ] == [0, 1, 1, 0, 1]
    state = MemoryRunState("run")
    controller = EntropyController(ControllerConfig())
    control = started(state, controller)
    control.after_step(controller, {"step": 1, "loss": math.nan, "nonfinite_steps": 1})
    assert state.status()["nonfinite_steps"] == 1
    with client(state) as api:
        assert api.get("/v1/status").json()["nonfinite_steps"] == 1
        assert 'stare_nonfinite_steps{run_id="run"} 1.0' in api.get("/metrics").text


@pytest.mark.slow
def test_a_run_fed_forged_changes_keeps_training_with_finite_loss(fast_overrides, redis_state_factory):
    """A real embedded run (tiny model, DeepSpeed on CPU) whose control state lives in a real Redis:
    the forged changes wait there before its first step; it rejects them all, and trains on finitely."""
    from stare.app.launch.embedded import EmbeddedRun, StopFlag
    from stare.app.launch.run_folder import prepare_run

    cfg = prepare_run(build_config({}, overrides=fast_overrides + ["run.name=forged", "run.steps=2"]), None)
    state = redis_state_factory()
    _forge(state, FORGED)
    run = EmbeddedRun(cfg, resume=False, log=lambda *_: None)
    try:
        run.train(StopFlag(), steering=RunSteering(state))
    finally:
        run.close()
    steps = state.metrics_page(0, 10).items
    assert [m["step"] for m in steps] == [1, 2]
    assert all(math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) for m in steps)
    assert steps[-1]["nonfinite_steps"] == 0 and steps[0]["control_changes"] == 0
    assert len(state.audit()) == len(FORGED) and all(e.error for e in state.audit())
    assert state.controller()["config"]["w"] == ControllerConfig().w
