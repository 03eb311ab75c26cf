"""Step metrics: a paged history and a server-sent-events stream.

Entries have absolute indexes (0 = the run's first step published; the oldest are dropped past the
store's bound). The stream sends each new entry as `id: <index>`, `event: metrics`, `data: <json>`;
a client that reconnects with `Last-Event-ID` (browsers' EventSource do) or `?after=` continues
where it left. A stream ends after `limit_s` seconds (clients reconnect); comments keep it alive.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from services.control.deps import StateDep
from stare.runstate.base import MetricsPage

log = logging.getLogger(__name__)
router = APIRouter(prefix="/metrics", tags=["metrics"])
_DIGITS = re.compile(r"[0-9]{1,15}")
POLL_S = 0.5
KEEPALIVE_S = 15.0


@router.get("/history", response_model=MetricsPage, summary="Step metrics, paged by absolute index")
def history(
    state: StateDep,
    offset: int = Query(0, ge=-1_000_000, le=1_000_000_000, description="First index; negative: from the end"),
    limit: int = Query(100, ge=1, le=1000),
) -> MetricsPage:
    return state.metrics_page(offset, limit)


async def _events(request: Request, state, after: int, limit_s: float) -> AsyncIterator[str]:
    deadline = time.monotonic() + limit_s
    next_index, last_sent, sent = after + 1, time.monotonic(), 0
    client = request.client.host if request.client else "unknown"
    try:
        yield "retry: 2000\n\n"
        while time.monotonic() < deadline and not await request.is_disconnected():
            page = await to_thread.run_sync(state.metrics_page, next_index, 100)
            if page.items:  # one write per page: a client that leaves mid-backlog costs one failed send
                yield "".join(
                    f"id: {page.offset + i}\nevent: metrics\ndata: {json.dumps(item)}\n\n"
                    for i, item in enumerate(page.items)
                )
                sent += len(page.items)
                last_sent = time.monotonic()
            elif time.monotonic() - last_sent > KEEPALIVE_S:
                yield ": keep-alive\n\n"
                last_sent = time.monotonic()
            next_index = page.next
            if not page.items:
                await asyncio.sleep(POLL_S)
    finally:  # once per stream, however it ended
        log.info(
            "metrics stream to %s ended after %d events (%s)",
            client,
            sent,
            "time limit" if time.monotonic() >= deadline else "client left",
        )


def last_event_index(header: str | None) -> int | None:
    """The index in a Last-Event-ID header: ASCII digits only (str.isdigit accepts '²'), else None."""
    if header is None or not _DIGITS.fullmatch(header.strip()):
        return None
    return int(header.strip())


@router.get(
    "/stream",
    summary="Server-sent events: each new step's metrics",
    responses={200: {"content": {"text/event-stream": {}}, "description": "An event stream"}},
)
def stream(
    request: Request,
    state: StateDep,
    after: int = Query(-1, ge=-1, le=1_000_000_000, description="Send entries after this index (-1: all kept)"),
    limit_s: float = Query(300.0, gt=0, le=3600, description="Close the stream after this many seconds"),
    last_event_id: Annotated[str | None, Header(max_length=32)] = None,
) -> StreamingResponse:
    if (index := last_event_index(last_event_id)) is not None:
        after = max(after, index)
    return StreamingResponse(
        _events(request, state, after, limit_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
