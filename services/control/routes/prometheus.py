"""GET /metrics: the run's Prometheus metrics (prometheus-client; text format 0.0.4, or OpenMetrics
when the scraper asks for it in Accept)."""

from __future__ import annotations

import threading

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client.exposition import choose_encoder

from services.control.auth import ReadAuth
from services.control.deps import StateDep
from services.control.prometheus import registry_for

router = APIRouter(tags=["prometheus"], dependencies=[ReadAuth])
_lock = threading.Lock()


def _registry(request: Request, state):
    """The app's registry over its run state, made on the first scrape."""
    app_state = request.app.state
    with _lock:
        if getattr(app_state, "prometheus_registry", None) is None:
            app_state.prometheus_registry = registry_for(state, app_state.run_id)
        return app_state.prometheus_registry


@router.get("/metrics", response_class=Response, summary="Prometheus metrics (text format 0.0.4 or OpenMetrics)")
def metrics(state: StateDep, request: Request) -> Response:
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(encoder(_registry(request, state)), media_type=content_type)
