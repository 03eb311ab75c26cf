"""Reads behind a read token, client addresses only to callers with a token, run commands audited.

With `control_plane.read_token_file` (or STARE_API_READ_TOKEN) every read needs a token: the read
token or the write token; the read token changes nothing. Without one reads stay open (a local
`stare train`), but an answer to a caller who showed no valid token withholds every client address
the audit logs hold. Pause, resume and checkpoint through the API are recorded (who, when) in a log
of their own, on both stores."""

from __future__ import annotations

import pytest
from control_helpers import AUTH, TOKEN, client, started

from services.control.addresses import withheld
from services.control.auth import resolve_read_token
from stare.config import ConfigError, ControlPlaneSection
from stare.runstate import MemoryRunState

READ_TOKEN = "read-only-token-9876543210"
READ = {"Authorization": f"Bearer {READ_TOKEN}"}
READS = ["/v1/status", "/v1/entropy", "/v1/entropy/audit", "/v1/run/audit", "/v1/metrics/history", "/metrics"]


@pytest.fixture
def state(controller):
    state = MemoryRunState("run")
    started(state, controller)
    return state


def guarded(state):
    from fastapi.testclient import TestClient

    from services.control.app import create_app

    app = create_app(
        state, ControlPlaneSection(trusted_hosts=["testserver"]), "run", token=TOKEN, read_token=READ_TOKEN
    )
    return TestClient(app, client=("10.0.0.5", 50000))


@pytest.mark.parametrize("path", READS)
def test_with_a_read_token_every_read_needs_a_token(state, path):
    api = guarded(state)
    missing = api.get(path)
    assert missing.status_code == 401 and "reads need the read token" in missing.json()["detail"]
    assert api.get(path, headers={"Authorization": "Bearer nope"}).status_code == 403
    assert api.get(path, headers=READ).status_code == 200
    assert api.get(path, headers=AUTH).status_code == 200  # the write token reads too


@pytest.mark.parametrize("method, path", [("post", "/v1/run/pause"), ("patch", "/v1/entropy")])
def test_the_read_token_changes_nothing(state, method, path):
    answer = getattr(guarded(state), method)(path, json={"target": 0.25}, headers=READ)
    assert answer.status_code == 403
    assert answer.json()["detail"].startswith("this is the read token: changes need the write token")
    assert not state.paused() and state.pending_entropy_changes() == []


def test_health_and_the_dashboard_page_stay_open(state):
    api = guarded(state)
    assert api.get("/v1/health").status_code == 200 and api.get("/").status_code == 200


def test_the_spec_says_reads_need_a_token(state):
    spec = guarded(state).get("/openapi.json").json()
    assert spec["paths"]["/v1/status"]["get"]["security"] == [{"HTTPBearer": []}]
    assert "security" not in spec["paths"]["/v1/health"]["get"]
    open_spec = client(state).get("/openapi.json").json()
    assert "security" not in open_spec["paths"]["/v1/status"]["get"]


def test_the_read_token_comes_from_the_environment_then_its_file(tmp_path):
    path = tmp_path / "read"
    path.write_text(f"{READ_TOKEN}\n")
    settings = ControlPlaneSection(read_token_file=path)
    assert resolve_read_token(settings, {}) == READ_TOKEN
    assert resolve_read_token(settings, {"STARE_API_READ_TOKEN": "from-env"}) == "from-env"
    assert resolve_read_token(ControlPlaneSection(), {}) is None
    with pytest.raises(ConfigError, match=r"control_plane.read_token_file: .*missing does not exist"):
        resolve_read_token(ControlPlaneSection(read_token_file=tmp_path / "missing"), {})


def test_the_write_token_as_read_token_is_refused(state):
    from services.control.app import create_app

    with pytest.raises(ConfigError, match="read_token_file holds the write token"):
        create_app(state, ControlPlaneSection(), "run", token=TOKEN, read_token=TOKEN)


def test_client_addresses_only_to_callers_with_a_token(state):
    """Reads open (no read token): the audit logs' addresses are withheld from callers without one."""
    from fastapi.testclient import TestClient

    from services.control.app import create_app

    app = create_app(state, ControlPlaneSection(trusted_hosts=["testserver"]), "run", token=TOKEN)
    api = TestClient(app, client=("10.0.0.5", 50000))
    actor = {**AUTH, "X-Stare-Actor": "alice@laptop (stare ctl)"}
    assert api.patch("/v1/entropy", json={"target": 0.25}, headers=actor).status_code == 202
    assert api.post("/v1/run/pause", headers=AUTH).status_code == 202  # no actor: the address alone
    seen = {
        "entropy": api.get("/v1/entropy/audit", headers=AUTH).json()[-1]["who"],
        "pending": api.get("/v1/entropy", headers=AUTH).json()["pending"][-1]["who"],
        "run": api.get("/v1/run/audit", headers=AUTH).json()[-1]["who"],
    }
    assert seen == {
        "entropy": "alice@laptop (stare ctl) (10.0.0.5)",
        "pending": "alice@laptop (stare ctl) (10.0.0.5)",
        "run": "10.0.0.5",
    }
    anonymous = {
        "entropy": api.get("/v1/entropy/audit").json()[-1]["who"],
        "pending": api.get("/v1/entropy").json()["pending"][-1]["who"],
        "run": api.get("/v1/run/audit").json()[-1]["who"],
    }
    assert anonymous == {
        "entropy": "alice@laptop (stare ctl)",
        "pending": "alice@laptop (stare ctl)",
        "run": "a client",
    }
    assert "10.0.0.5" not in api.get("/v1/status").text + api.get("/metrics").text


@pytest.mark.parametrize(
    ("who", "shown"),
    [
        ("alice@laptop (stare ctl) (10.0.0.5)", "alice@laptop (stare ctl)"),
        ("bob (::1)", "bob"),
        ("192.168.1.7", "a client"),
        ("unknown", "a client"),
        ("x (1.2.3.4) [not from the control plane]", "x [not from the control plane]"),
        ("1.2.3.4 [not from the control plane]", "a client [not from the control plane]"),
        ("unknown (a malformed pending entry in the store)", "unknown (a malformed pending entry in the store)"),
        ("ops (prod)", "ops (prod)"),
    ],
)
def test_withheld_drops_addresses_and_keeps_labels(who, shown):
    assert withheld(who) == shown


def test_pause_resume_and_checkpoint_are_audited_in_order(make_state, controller):
    state = make_state()
    started(state, controller)
    api = client(state)
    actor = {**AUTH, "X-Stare-Actor": "ops"}
    for command in ("pause", "checkpoint", "resume"):
        answer = api.post(f"/v1/run/{command}", headers=actor)
        assert answer.status_code == 202 and answer.json()["audit"]["command"] == command
    log = api.get("/v1/run/audit", headers=AUTH).json()
    assert [(e["id"], e["command"], e["who"]) for e in log] == [
        (1, "pause", "ops (testclient)"),
        (2, "checkpoint", "ops (testclient)"),
        (3, "resume", "ops (testclient)"),
    ]
    assert log[0]["when"] <= log[1]["when"] <= log[2]["when"]
    assert [e["command"] for e in api.get("/v1/run/audit?limit=2", headers=AUTH).json()] == ["checkpoint", "resume"]
    refused = api.post("/v1/run/pause")  # no token: refused, and not recorded
    assert refused.status_code == 401 and len(state.commands()) == 3


def test_the_command_log_is_bounded(make_state):
    state = make_state(max_audit=3)
    for command in ("pause", "resume", "pause", "checkpoint", "resume"):
        state.record_command(command, "ops")
    assert [(e.id, e.command) for e in state.commands()] == [(3, "pause"), (4, "checkpoint"), (5, "resume")]
    assert state.commands(0) == []


def test_ctl_audit_run_prints_the_command_log(state, capsys):
    from services.control.app import create_app
    from services.control.server import BackgroundServer
    from stare.app.cli import main

    server = BackgroundServer(create_app(state, ControlPlaneSection(), "run", token=TOKEN), "127.0.0.1", 0).start()
    try:
        assert main(["ctl", "--url", server.url, "--token", TOKEN, "pause"]) == 0
        capsys.readouterr()
        assert main(["ctl", "--url", server.url, "--token", TOKEN, "audit", "--run"]) == 0
    finally:
        server.stop()
    import json

    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["command"] == "pause" and entry["who"].endswith("(stare ctl) (127.0.0.1)")
