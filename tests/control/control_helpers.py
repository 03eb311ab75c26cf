"""Helpers of the control-plane tests (fixtures are in conftest.py)."""

from __future__ import annotations

from stare.config import ControlPlaneSection
from stare.runstate import RunSteering

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def started(state, controller) -> RunSteering:
    """A RunSteering that has published the controller, as the learner does when it starts."""
    control = RunSteering(state)
    control.start(controller)
    return control


def client(state, token: str | None = TOKEN, **settings):
    from fastapi.testclient import TestClient

    from services.control.app import create_app

    settings.setdefault("trusted_hosts", ["testserver"])  # TestClient's Host
    return TestClient(create_app(state, ControlPlaneSection(**settings), state.run_id, token=token))
