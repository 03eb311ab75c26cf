"""The OpenAPI document as this app instance behaves (so schemathesis' conformance checks hold).

FastAPI derives `security` from the auth dependencies, which exist on every route; whether one
actually asks for the token depends on the policy (reads: only with control_plane.auth_reads; changes:
not when allow_unauthenticated has no token). This sets `security` per operation from the policy,
declares 401/403 where the token is checked, 403 (cross-site) on every change, 413 on bodies, 503 on
store reads, and the error body the handlers really send (`ErrorBody`, not FastAPI's default).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

from services.control.auth import AuthPolicy

_NO_STORE = {"/v1/health"}  # answered without the run state store
_ERR = "#/components/schemas/ErrorBody"


class ErrorItem(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    detail: str = Field(description="What was wrong and how to fix it.")
    errors: list[ErrorItem] | None = Field(None, description="One item per invalid field (422 only).")


def _needs_token(policy: AuthPolicy, method: str) -> bool:
    if method == "get":
        return policy.reads_need_token and not (
            policy.token is None and policy.read_token is None and policy.allow_unauthenticated
        )
    return not (policy.token is None and policy.allow_unauthenticated)


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": _ERR}}}}


def _describe(path: str, method: str, op: dict[str, Any], policy: AuthPolicy) -> None:
    responses = op.setdefault("responses", {})
    if "security" in op and _needs_token(policy, method):  # FastAPI declares it where an auth dependency is
        op["security"] = [{"HTTPBearer": []}]
        responses.setdefault("401", _error("Missing bearer token"))
        responses.setdefault("403", _error("Wrong token, or no token configured for changes"))
    else:
        op.pop("security", None)
    if method != "get":
        responses.setdefault("403", _error("Cross-site request (Origin or Sec-Fetch-Site), or an auth failure"))
    if "requestBody" in op:
        responses.setdefault("400", _error("The body is not JSON"))
        responses.setdefault("413", _error("Request body over control_plane.max_body_bytes"))
    for code, response in responses.items():
        if code == "422" or (code[0] in "45" and "content" not in response):
            responses[code] = _error(response.get("description") or "Error")
    if path not in _NO_STORE and path.startswith("/v1/") and path != "/v1/ready":
        responses.setdefault("503", _error("The run state store (Redis) does not answer"))


def install(app: FastAPI, policy: AuthPolicy) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            body = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(body.pop("$defs", {}))
            schemas["ErrorBody"] = body
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            for path, ops in schema.get("paths", {}).items():
                for method, op in ops.items():
                    _describe(path, method, op, policy)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
