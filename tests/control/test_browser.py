"""What a browser page can do to the control plane (a real uvicorn server on a free port): no
cross-site change in either auth mode, no foreign Host (DNS rebinding), security headers on the
dashboard, no Swagger page from a CDN unless asked, a strict Last-Event-ID."""

from __future__ import annotations

import httpx
import pytest
from control_helpers import AUTH, TOKEN, started

from services.control.app import create_app
from services.control.server import BackgroundServer
from stare.config import ControlPlaneSection
from stare.runstate import MemoryRunState

MODES = {"token": dict(token=TOKEN), "unauthenticated": dict(token="", allow_unauthenticated=True)}


@pytest.fixture(params=list(MODES))
def served(request, controller):
    options = dict(MODES[request.param])
    token = options.pop("token")
    state = MemoryRunState("run")
    started(state, controller)
    server = BackgroundServer(
        create_app(state, ControlPlaneSection(**options), "run", token=token), "127.0.0.1", 0
    ).start()
    yield state, server.url, (AUTH if token else {})
    server.stop()


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example", "Content-Type": "text/plain"},  # a simple cross-site form/fetch
        {"Origin": "null"},  # sandboxed iframe, file://
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": "http://127.0.0.1:1"},  # another local port is another origin
    ],
)
def test_a_cross_site_mutation_is_refused_in_both_auth_modes(served, headers):
    state, url, auth = served
    r = httpx.post(url + "/v1/run/pause", headers={**auth, **headers}, content=b"x", timeout=5)
    assert r.status_code == 403 and "cross-site" in r.json()["detail"]
    r = httpx.patch(url + "/v1/entropy", headers={**auth, **headers}, json={"target": 0.5}, timeout=5)
    assert r.status_code == 403
    assert not state.paused() and state.pending_entropy_changes() == []


def test_the_dashboards_own_origin_and_non_browser_clients_may_change(served):
    state, url, auth = served
    r = httpx.post(url + "/v1/run/pause", headers={**auth, "Origin": url, "Sec-Fetch-Site": "same-origin"}, timeout=5)
    assert r.status_code == 202 and state.paused()
    assert httpx.post(url + "/v1/run/resume", headers=auth, timeout=5).status_code == 202  # curl: no Origin
    assert not state.paused()


def test_a_foreign_host_header_is_refused(served):
    _, url, auth = served
    r = httpx.get(url + "/v1/status", headers={"Host": "attacker.example"}, timeout=5)  # DNS rebinding
    assert r.status_code == 400
    assert httpx.get(url + "/v1/status", headers={"Host": "localhost"}, timeout=5).status_code == 200


def test_trusted_hosts_and_allowed_origins_come_from_the_config(controller):
    state = MemoryRunState("run")
    started(state, controller)
    settings = ControlPlaneSection(trusted_hosts=["stare.example.org"], allowed_origins=["https://dash.example.org"])
    server = BackgroundServer(create_app(state, settings, "run", token=TOKEN), "127.0.0.1", 0).start()
    try:
        host = {"Host": "stare.example.org"}
        assert httpx.get(server.url + "/v1/status", timeout=5).status_code == 400  # 127.0.0.1 is not listed
        r = httpx.post(
            server.url + "/v1/run/pause", headers={**host, **AUTH, "Origin": "https://dash.example.org"}, timeout=5
        )
        assert r.status_code == 202
    finally:
        server.stop()


def test_the_dashboard_has_security_headers_and_docs_are_off(served):
    _, url, _ = served
    r = httpx.get(url + "/", timeout=5)
    assert r.status_code == 200
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
    assert httpx.get(url + "/docs", timeout=5).status_code == 404  # no CDN-loaded page by default
    assert httpx.get(url + "/openapi.json", timeout=5).status_code == 200


@pytest.mark.parametrize("header", [b"\xb2", b"1\xb2", b"-1", b"12a"])
def test_a_non_ascii_digit_last_event_id_is_ignored(served, header):
    _, url, _ = served
    with httpx.stream("GET", url + "/v1/metrics/stream?limit_s=0.2", headers={"Last-Event-ID": header}, timeout=5) as r:
        assert r.status_code == 200
        r.read()
