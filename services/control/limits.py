"""Resource limits of the control plane's HTTP server, enforced before any route code runs.

* `BodyLimit` (ASGI middleware, outermost): a request whose Content-Length exceeds `max_bytes` is
  answered 413 before one byte of its body is read; a body without Content-Length (chunked) is
  counted while it streams and refused with 413 as soon as it passes the limit; a body that stops
  arriving for `body_timeout_s` is answered 408. JSON parsing and the auth dependencies run later,
  so an unauthenticated client cannot make the server buffer more than `max_bytes`.
* `GuardedH11Protocol` (uvicorn's h11 protocol): a connection whose request headers are not complete
  within `header_timeout_s` of its opening (or of the previous response) is closed, so idle or
  half-sent connections (slowloris) do not hold a slot; uvicorn's `limit_concurrency` caps
  connections and `timeout_keep_alive` closes idle keep-alive ones (see server.py).
"""

from __future__ import annotations

import asyncio
import json
import logging

import h11
from starlette.exceptions import HTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


class _TooLarge(HTTPException):
    """An HTTPException, so FastAPI's body parsing passes it on (it turns other errors into 400)."""

    def __init__(self, detail: str):
        super().__init__(413, detail, headers={"Connection": "close"})


class _TooSlow(HTTPException):
    def __init__(self, detail: str):
        super().__init__(408, detail, headers={"Connection": "close"})


async def _reply(send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Refuse request bodies over `max_bytes` (413) and bodies stalled for `body_timeout_s` (408)."""

    def __init__(self, app, max_bytes: int, body_timeout_s: float):
        self.app, self.max_bytes, self.body_timeout_s = app, max_bytes, body_timeout_s
        self._too_slow = f"request body not received within {body_timeout_s}s (control_plane.body_timeout_s)"

    def _too_large(self, size: str) -> str:
        return (
            f"request body {size} exceeds the limit of {self.max_bytes} bytes (control_plane.max_body_bytes); "
            "the API's bodies are small JSON objects"
        )

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None:
            if not length.isdigit():  # ASCII digits only (h11 already refuses most others)
                await _reply(send, 400, "invalid Content-Length header")
                return
            if int(length) > self.max_bytes:
                await _reply(send, 413, self._too_large(f"of {int(length)} bytes"))
                return
        received, started = 0, False

        async def limited_receive():
            nonlocal received
            try:
                message = await asyncio.wait_for(receive(), self.body_timeout_s)
            except TimeoutError:
                raise _TooSlow(self._too_slow) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _TooLarge(self._too_large("(streamed)"))
            return message

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except (_TooLarge, _TooSlow) as err:
            if started:  # a streaming response already began: nothing to answer, drop the connection
                raise
            await _reply(send, err.status_code, err.detail)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a deadline for each request's headers (config.header_timeout_s,
    set by server.py): connections that open and say nothing, or send headers byte by byte, close."""

    header_timeout_s = 10.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_deadline()

    def connection_lost(self, exc) -> None:
        self._cancel_header_deadline()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        self._cancel_header_deadline()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _cancel_header_deadline(self) -> None:
        handle = getattr(self, "_header_deadline", None)
        if handle is not None:
            handle.cancel()
            self._header_deadline = None

    def _header_timeout(self) -> None:
        # their_state leaves IDLE once a request's headers are complete
        if (
            not self.transport.is_closing()
            and self.conn.their_state in (h11.IDLE, h11.DONE)
            and (self.cycle is None or self.cycle.response_complete)
        ):
            log.info(
                "control plane: closing a connection without complete request headers after %.1fs",
                self.header_timeout_s,
            )
            self.transport.close()


def guarded_protocol(header_timeout_s: float) -> type[GuardedH11Protocol]:
    """The protocol class with this header deadline (uvicorn builds one instance per connection)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"header_timeout_s": header_timeout_s})
