"""Bearer-token auth of the control plane.

The token comes from STARE_API_TOKEN, else from `control_plane.token_file` (a mounted secret); it is
compared in constant time and never logged or echoed. Mutating endpoints always need it; reads
need it when `control_plane.auth_reads`. With no token configured, mutating endpoints are refused
(403, saying how to set one) unless `control_plane.allow_unauthenticated`.
Not covered: several tokens, scopes, rotation without a restart.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from stare.config import ConfigError, ControlPlaneSection

TOKEN_ENV = "STARE_API_TOKEN"
_bearer = HTTPBearer(
    auto_error=False, description=f"The control plane's API token ({TOKEN_ENV} or control_plane.token_file)."
)


@dataclass(frozen=True)
class AuthPolicy:
    token: str | None
    auth_reads: bool
    allow_unauthenticated: bool

    def __repr__(self) -> str:  # never show the token
        return f"AuthPolicy(token={'set' if self.token else None}, auth_reads={self.auth_reads})"


def resolve_token(settings: ControlPlaneSection, environ: dict[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    token = env.get(TOKEN_ENV, "").strip()
    if token:
        return token
    if settings.token_file is not None:
        path = Path(settings.token_file)
        if not path.is_file():
            raise ConfigError(
                f"control_plane.token_file: {path} does not exist; point it at a file holding the API token"
            )
        token = path.read_text().strip()
        if not token:
            raise ConfigError(f"control_plane.token_file: {path} is empty; write the API token into it")
        return token
    return None


def policy_from(settings: ControlPlaneSection, token: str | None) -> AuthPolicy:
    return AuthPolicy(
        token=token or None, auth_reads=settings.auth_reads, allow_unauthenticated=settings.allow_unauthenticated
    )


def _check(policy: AuthPolicy, creds: HTTPAuthorizationCredentials | None) -> None:
    if policy.token is None:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"this control plane has no API token configured, so changes are refused; set {TOKEN_ENV} (or "
            "control_plane.token_file) where the control plane runs, or control_plane.allow_unauthenticated=true for local experiments",
        )
    if creds is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(creds.credentials.encode(), policy.token.encode()):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "wrong API token")


Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def require_write(request: Request, creds: Credentials) -> None:
    """Dependency of every mutating endpoint."""
    policy: AuthPolicy = request.app.state.auth
    if policy.token is None and policy.allow_unauthenticated:
        return
    _check(policy, creds)


def require_read(request: Request, creds: Credentials) -> None:
    """Dependency of every read endpoint (a no-op unless control_plane.auth_reads)."""
    policy: AuthPolicy = request.app.state.auth
    if not policy.auth_reads or (policy.token is None and policy.allow_unauthenticated):
        return
    _check(policy, creds)


WriteAuth = Depends(require_write)
ReadAuth = Depends(require_read)
