"""`create_app(state, settings, run_id)`: the control plane's FastAPI app over a RunState.

The app keeps no run state of its own (only its settings and the auth policy), so several replicas
can serve one Redis. Errors are JSON `{"detail": "...", "errors": [{"field", "message"}]}`: 422
names the field (body validation, band order, bounds); before a learner has published its controller,
GET /v1/entropy is 404 and a change 409; 503 when the store does not answer within its retry budget;
500 naming the key and the fix when it holds what stare does not write (RunStateMalformed).
Before any route: security headers (outermost: on every reply), limits.BodyLimit (413/408), security
(trusted hosts, same-origin changes);
openapi.py makes the spec say what this instance does (auth per operation, error bodies).
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.control import openapi, security
from services.control.auth import ReadAuth, policy_from, resolve_read_token, resolve_token
from services.control.limits import BodyLimit
from services.control.routes import (
    dashboard,
    entropy,
    health,
    metrics,
    prometheus,
    run,
    status,
)
from stare.config import ControlPlaneSection
from stare.runstate.base import EntropyChangeError, RunState, RunStateMalformed, RunStateUnavailable

API_VERSION = "v1"


def _field(loc: tuple) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "header", "path")]
    return ".".join(parts) or "body"


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [{"field": _field(tuple(e["loc"])), "message": e["msg"]} for e in exc.errors()]
    detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
    return JSONResponse({"detail": f"invalid request: {detail}", "errors": errors}, status_code=422)


async def _change_error(request: Request, exc: EntropyChangeError) -> JSONResponse:
    return JSONResponse({"detail": str(exc), "errors": [{"field": exc.field, "message": exc.message}]}, status_code=422)


async def _http_error(request: Request, exc: StarletteHTTPException):
    """FastAPI's handler, but a 405 lists in Allow every method of the path (Starlette lists only
    those of the first route that matched, e.g. GET of /v1/entropy and not its PUT and PATCH)."""
    if exc.status_code != 405:
        return await http_exception_handler(request, exc)
    methods = {
        m
        for r in request.app.routes
        if isinstance(r, APIRoute) and r.path_regex.match(request.url.path)
        for m in r.methods
    }
    return JSONResponse(
        {"detail": f"method {request.method} not allowed; allowed: {', '.join(sorted(methods))}"},
        status_code=405,
        headers={"Allow": ", ".join(sorted(methods))},
    )


async def _malformed(request: Request, exc: RunStateMalformed) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=500)


async def _unavailable(request: Request, exc: RunStateUnavailable) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "2"})


def create_app(
    state: RunState,
    settings: ControlPlaneSection,
    run_id: str,
    *,
    token: str | None = None,
    read_token: str | None = None,
) -> FastAPI:
    """The API. `token`: the write token (None: STARE_API_TOKEN, else control_plane.token_file; "": none);
    `read_token` likewise (STARE_API_READ_TOKEN, control_plane.read_token_file)."""
    app = FastAPI(
        title="stare control plane",
        version=API_VERSION,
        description="Run status, the entropy controller, metrics and run commands of one stare run.",
        docs_url="/docs" if settings.docs else None,
        redoc_url=None,
    )
    app.state.run_state, app.state.run_id, app.state.settings = state, run_id, settings
    app.state.auth = policy_from(
        settings,
        token if token is not None else resolve_token(settings),
        read_token if read_token is not None else resolve_read_token(settings),
    )
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(EntropyChangeError, _change_error)
    app.add_exception_handler(RunStateUnavailable, _unavailable)
    app.add_exception_handler(RunStateMalformed, _malformed)
    app.add_exception_handler(StarletteHTTPException, _http_error)

    v1 = APIRouter(prefix=f"/{API_VERSION}")
    v1.include_router(health.router)
    v1.include_router(status.router, dependencies=[ReadAuth])
    v1.include_router(entropy.router, dependencies=[ReadAuth])
    v1.include_router(metrics.router, dependencies=[ReadAuth])
    v1.include_router(run.router)
    app.include_router(v1)
    app.include_router(prometheus.router)
    app.include_router(dashboard.router)
    openapi.install(app, app.state.auth)
    security.install(app, settings)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, body_timeout_s=settings.body_timeout_s)
    security.install_headers(app, settings)  # outermost: every reply, the outer layers' 400/403/413 too
    return app
