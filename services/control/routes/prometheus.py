"""GET /metrics: Prometheus text exposition of the latest step, status, queues and role liveness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from stare.services.control import prometheus
from stare.services.control.auth import ReadAuth
from stare.services.control.deps import StateDep

router = APIRouter(tags=["prometheus"], dependencies=[ReadAuth])


@router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics (text format 0.0.4)")
def metrics(state: StateDep, request: Request) -> PlainTextResponse:
    page = state.metrics_page(-1, 1)
    text = prometheus.render(request.app.state.run_id, page.items[-1] if page.items else None, state.status(),
                             state.roles(), state.paused())
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")
