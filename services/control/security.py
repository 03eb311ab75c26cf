"""The control plane's browser-facing protections (ASGI middleware; app.py installs them).

* Trusted hosts: requests whose Host header is not in `control_plane.trusted_hosts` get 400 (Starlette's
  TrustedHostMiddleware), which stops DNS-rebinding pages from reading or driving a local API. Default
  (None): the loopback names when the API listens on a loopback address, else any host.
* Cross-site mutations: a POST/PUT/PATCH/DELETE that a browser marks as cross-site (Sec-Fetch-Site:
  cross-site) or whose Origin is not the API's own origin (scheme://Host) nor in
  `control_plane.allowed_origins` is refused with 403, whatever the auth mode (so a page on another site
  cannot pause a run that allows unauthenticated changes). Requests without Origin and Sec-Fetch-Site
  are not from a browser page (curl, `stare ctl`) and pass on to the token check.
* Security headers on every response: a Content-Security-Policy allowing only this origin's scripts,
  styles and connections, no framing (frame-ancestors 'none', X-Frame-Options DENY), nosniff, and no
  referrer.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from starlette.middleware.trustedhost import TrustedHostMiddleware

from stare.config import ControlPlaneSection

_SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
_LOOPBACK = ("127.0.0.1", "::1", "localhost")
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


def trusted_hosts(settings: ControlPlaneSection) -> list[str]:
    """`control_plane.trusted_hosts`, else the loopback names for a loopback `control_plane.host`, else any ("*")."""
    if settings.trusted_hosts is not None:
        return list(settings.trusted_hosts)
    if settings.host in _LOOPBACK or settings.host.startswith("127."):
        return ["127.0.0.1", "localhost", "::1", "[::1]"]
    return ["*"]


def _header(scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def _origin_of(url: str) -> tuple[str, str, int | None] | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return parts.scheme, parts.hostname.lower(), port or (443 if parts.scheme == "https" else 80)


async def _forbid(send, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class SameOrigin:
    """Refuse mutations from another site's pages (403), in every auth mode."""

    def __init__(self, app, allowed_origins: list[str]):
        self.app = app
        self.allowed = {o for o in (_origin_of(u) for u in allowed_origins) if o is not None}

    def _own_origin(self, scope) -> tuple[str, str, int | None] | None:
        host = _header(scope, b"host")
        return None if host is None else _origin_of(f"{scope.get('scheme', 'http')}://{host}")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] in _SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        site, origin = _header(scope, b"sec-fetch-site"), _header(scope, b"origin")
        if site == "cross-site":
            await _forbid(
                send,
                "cross-site request refused: changes are accepted from this API's own pages and "
                "from non-browser clients only (control_plane.allowed_origins lists other origins)",
            )
            return
        if origin is not None:
            parsed = _origin_of(origin)
            if parsed is None or (parsed != self._own_origin(scope) and parsed not in self.allowed):
                await _forbid(
                    send,
                    f"Origin {origin[:100]!r} is not this API's origin nor in control_plane.allowed_origins; "
                    "cross-site changes are refused",
                )
                return
        await self.app(scope, receive, send)


class SecurityHeaders:
    """Add CSP, X-Frame-Options, nosniff and Referrer-Policy to every HTTP response."""

    def __init__(self, app, *, relaxed_paths: tuple[str, ...] = (), relaxed_csp: str = ""):
        self.app, self.relaxed_paths, self.relaxed_csp = app, relaxed_paths, relaxed_csp

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _HEADERS
        if scope["path"] in self.relaxed_paths:
            headers = [(b"content-security-policy", self.relaxed_csp.encode()), *_HEADERS[1:]]

        async def with_headers(message):
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                message = {
                    **message,
                    "headers": [*message.get("headers", []), *((k, v) for k, v in headers if k not in present)],
                }
            await send(message)

        await self.app(scope, receive, with_headers)


def install(app, settings: ControlPlaneSection) -> None:
    """Add the host and origin checks (Starlette runs the last added first: hosts, then origin)."""
    app.add_middleware(SameOrigin, allowed_origins=list(settings.allowed_origins))
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=trusted_hosts(settings))


def install_headers(app, settings: ControlPlaneSection) -> None:
    """Add the security headers; app.py calls it last, so that they wrap every other layer (the
    Host check's 400, the Origin check's 403, the body limit's 413 and 408 carry them too)."""
    docs_csp = (
        "default-src 'none'; script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; "
        "style-src 'self' https://cdn.jsdelivr.net; img-src 'self' data: https://fastapi.tiangolo.com; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'"
    )  # Swagger UI (control_plane.docs only)
    app.add_middleware(SecurityHeaders, relaxed_paths=("/docs",) if settings.docs else (), relaxed_csp=docs_csp)
