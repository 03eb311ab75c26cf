"""Bearer auth: mutating endpoints need the token, reads when auth_reads; 401 missing, 403 wrong,
403 with the fix when no token is configured; the token is never logged."""

from __future__ import annotations

import logging

import pytest
from control_helpers import AUTH, TOKEN, client, started

from services.control.auth import resolve_token
from stare.config import ConfigError, ControlPlaneSection
from stare.runstate import MemoryRunState

MUTATING = [
    ("post", "/v1/run/pause", None),
    ("post", "/v1/run/resume", None),
    ("post", "/v1/run/checkpoint", None),
    ("put", "/v1/entropy", {"target": 0.4}),
    ("patch", "/v1/entropy", {"target": 0.4}),
]
READS = ["/v1/status", "/v1/entropy", "/v1/entropy/audit", "/v1/metrics/history", "/metrics"]


@pytest.fixture
def state(controller):
    state = MemoryRunState("run")
    started(state, controller)
    return state


@pytest.mark.parametrize("method, path, body", MUTATING)
def test_a_mutating_call_without_a_token_is_401(state, method, path, body):
    r = getattr(client(state), method)(path, json=body)
    assert r.status_code == 401 and "missing bearer token" in r.json()["detail"]
    assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("method, path, body", MUTATING)
def test_a_mutating_call_with_a_wrong_token_is_403(state, method, path, body):
    r = getattr(client(state), method)(path, json=body, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 403 and r.json()["detail"] == "wrong API token"


@pytest.mark.parametrize("method, path, body", MUTATING)
def test_a_mutating_call_with_the_token_is_accepted(state, method, path, body):
    assert getattr(client(state), method)(path, json=body, headers=AUTH).status_code == 202


def test_without_a_configured_token_changes_are_refused_with_the_fix(state, monkeypatch):
    monkeypatch.delenv("STARE_API_TOKEN", raising=False)
    r = client(state, token=None).post("/v1/run/pause", headers=AUTH)
    assert r.status_code == 403
    assert "STARE_API_TOKEN" in r.json()["detail"] and "allow_unauthenticated" in r.json()["detail"]


def test_allow_unauthenticated_accepts_changes_when_no_token_is_configured(state, monkeypatch):
    monkeypatch.delenv("STARE_API_TOKEN", raising=False)
    assert client(state, token=None, allow_unauthenticated=True).post("/v1/run/pause").status_code == 202


@pytest.mark.parametrize("path", READS)
def test_reads_are_open_by_default(state, path):
    assert client(state).get(path).status_code == 200


@pytest.mark.parametrize("path", READS)
def test_reads_need_the_token_with_auth_reads(state, path):
    api = client(state, auth_reads=True)
    assert api.get(path).status_code == 401
    assert api.get(path, headers={"Authorization": "Bearer nope"}).status_code == 403
    assert api.get(path, headers=AUTH).status_code == 200


def test_health_and_the_dashboard_page_stay_open_with_auth_reads(state):
    api = client(state, auth_reads=True)
    assert (api.get("/v1/health").status_code, api.get("/").status_code) == (200, 200)


def test_the_token_comes_from_the_environment_first_then_the_token_file(tmp_path):
    secret = tmp_path / "token"
    secret.write_text("from-file\n")
    settings = ControlPlaneSection(token_file=secret)
    assert resolve_token(settings, {"STARE_API_TOKEN": "from-env"}) == "from-env"
    assert resolve_token(settings, {}) == "from-file"
    assert resolve_token(ControlPlaneSection(), {}) is None


def test_a_missing_token_file_is_a_config_error_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match="control_plane.token_file"):
        resolve_token(ControlPlaneSection(token_file=tmp_path / "absent"), {})


def test_the_token_is_never_logged_or_echoed(state, caplog):
    caplog.set_level(logging.DEBUG)
    api = client(state)
    responses = [
        api.post("/v1/run/pause", headers={"Authorization": f"Bearer {TOKEN}x"}),
        api.post("/v1/run/pause", headers=AUTH),
    ]
    assert all(TOKEN not in r.text for r in responses)
    assert TOKEN not in caplog.text and TOKEN not in repr(api.app.state.auth)
