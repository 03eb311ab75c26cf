"""Entropy requests are validated like the config: 422 names the field and says what is wrong."""

from __future__ import annotations

import pytest
from control_helpers import AUTH, client, started

from stare.runstate import MemoryRunState


@pytest.fixture
def api(controller):
    state = MemoryRunState("run")
    started(state, controller)  # target 0.3, w 1.1 (w_max 1.5), m 0.9 (m_min 0.5)
    return client(state)


@pytest.mark.parametrize(
    "method, body, field, words",
    [
        ("patch", {"target": -0.1}, "target", "greater than 0"),
        ("patch", {"target": "high"}, "target", "valid number"),
        ("patch", {"w": 0.5}, "w", "greater than or equal to 1"),
        ("patch", {"m": 1.5}, "m", "less than or equal to 1"),
        ("patch", {"alpha": -1}, "alpha", "greater than or equal to 0"),
        ("patch", {"band": [0.1]}, "band.1", "required"),
        ("patch", {"band": [0.4, 0.2]}, "band", "low <= target <= high"),
        ("patch", {"band": [0.35, 0.5]}, "band", "low <= target <= high"),  # target 0.3 below the band
        ("patch", {"w": 1.6}, "w", "w_max"),
        ("patch", {"m": 0.6, "m_min": 0.7}, "m", "m_min"),  # M under its own new bound (an M not given is clipped)
        ("patch", {"entropy_source": "magic"}, "entropy_source", "prepass"),
        ("patch", {"bogus": 2}, "bogus", "Extra inputs"),
        ("patch", {}, "body", "no field to change"),
        ("put", {"band": [0.2, 0.4]}, "target", "required"),
        ("put", {"target": 0.5, "band": [0.2, 0.4]}, "band", "low <= target <= high"),
    ],
)
def test_invalid_entropy_requests_are_422_naming_the_field(api, method, body, field, words):
    r = getattr(api, method)("/v1/entropy", json=body, headers=AUTH)
    assert r.status_code == 422
    errors = r.json()["errors"]
    assert errors[0]["field"] == field and words in errors[0]["message"]
    assert r.json()["detail"].count(field) >= 1
    assert api.get("/v1/entropy").json()["pending"] == []  # nothing queued


@pytest.mark.parametrize(
    "params, field", [({"limit": 0}, "limit"), ({"limit": 5000}, "limit"), ({"offset": "x"}, "offset")]
)
def test_bad_history_paging_is_422_naming_the_parameter(api, params, field):
    r = api.get("/v1/metrics/history", params=params)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == field


def test_a_band_in_order_around_the_target_is_accepted(api):
    r = api.patch("/v1/entropy", json={"target": 0.35, "band": [0.3, 0.4]}, headers=AUTH)
    assert r.status_code == 202 and r.json()["audit"]["new"] == {"target": 0.35, "band": [0.3, 0.4]}
