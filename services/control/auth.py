"""Bearer-token auth of the control plane: a write token, and optionally a read token.

The write token comes from STARE_API_TOKEN, else from `control_plane.token_file` (a mounted secret);
the read token from STARE_API_READ_TOKEN, else `control_plane.read_token_file`. Both are compared in
constant time and never logged or echoed. Mutating endpoints always need the write token. Reads
need a token (the read token or the write token) when a read token is configured or
`control_plane.auth_reads`; else they are open. The read token exists so that what only reads
(Prometheus, Grafana, a dashboard viewer) never holds the token that pauses a run or moves its
entropy target. With no write token configured, mutating endpoints are refused (403, saying how
to set one) unless `control_plane.allow_unauthenticated`. `request.state.authenticated` says
whether the request showed a valid token (routes keep client addresses out of other answers).
Not covered: more tokens, scopes per endpoint, rotation without a restart.
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
READ_TOKEN_ENV = "STARE_API_READ_TOKEN"
_bearer = HTTPBearer(
    auto_error=False, description=f"The control plane's API token ({TOKEN_ENV} or control_plane.token_file)."
)


@dataclass(frozen=True)
class AuthPolicy:
    token: str | None
    auth_reads: bool
    allow_unauthenticated: bool
    read_token: str | None = None

    def __repr__(self) -> str:  # never show a token
        return (
            f"AuthPolicy(token={'set' if self.token else None}, read_token={'set' if self.read_token else None}, "
            f"auth_reads={self.auth_reads})"
        )

    @property
    def reads_need_token(self) -> bool:
        return self.auth_reads or self.read_token is not None


def _token(env_name: str, path: Path | None, field: str, environ: dict[str, str] | None) -> str | None:
    env = os.environ if environ is None else environ
    token = env.get(env_name, "").strip()
    if token:
        return token
    if path is None:
        return None
    if not Path(path).is_file():
        raise ConfigError(f"control_plane.{field}: {path} does not exist; point it at a file holding the token")
    token = Path(path).read_text().strip()
    if not token:
        raise ConfigError(f"control_plane.{field}: {path} is empty; write the token into it")
    return token


def resolve_token(settings: ControlPlaneSection, environ: dict[str, str] | None = None) -> str | None:
    """The write token: STARE_API_TOKEN, else control_plane.token_file, else None."""
    return _token(TOKEN_ENV, settings.token_file, "token_file", environ)


def resolve_read_token(settings: ControlPlaneSection, environ: dict[str, str] | None = None) -> str | None:
    """The read token: STARE_API_READ_TOKEN, else control_plane.read_token_file, else None."""
    return _token(READ_TOKEN_ENV, settings.read_token_file, "read_token_file", environ)


def policy_from(settings: ControlPlaneSection, token: str | None, read_token: str | None = None) -> AuthPolicy:
    if read_token and token and hmac.compare_digest(read_token.encode(), token.encode()):
        raise ConfigError(
            "control_plane.read_token_file holds the write token: whoever only reads could change the run; "
            "give readers a token of their own (scripts/make_secrets.sh makes deploy/secrets/api-read-token)"
        )
    return AuthPolicy(
        token=token or None,
        auth_reads=settings.auth_reads,
        allow_unauthenticated=settings.allow_unauthenticated,
        read_token=read_token or None,
    )


def _matches(creds: HTTPAuthorizationCredentials | None, token: str | None) -> bool:
    return creds is not None and token is not None and hmac.compare_digest(creds.credentials.encode(), token.encode())


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
    if not _matches(creds, policy.token):
        if _matches(creds, policy.read_token):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                f"this is the read token: changes need the write token ({TOKEN_ENV} or control_plane.token_file)",
            )
        raise HTTPException(status.HTTP_403_FORBIDDEN, "wrong API token")


Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def require_write(request: Request, creds: Credentials) -> None:
    """Dependency of every mutating endpoint."""
    policy: AuthPolicy = request.app.state.auth
    request.state.authenticated = _matches(creds, policy.token)
    if policy.token is None and policy.allow_unauthenticated:
        return
    _check(policy, creds)


def require_read(request: Request, creds: Credentials) -> None:
    """Dependency of every read endpoint: open unless a read token is configured or
    control_plane.auth_reads; then the read token or the write token."""
    policy: AuthPolicy = request.app.state.auth
    request.state.authenticated = _matches(creds, policy.token) or _matches(creds, policy.read_token)
    if not policy.reads_need_token or request.state.authenticated:
        return
    if policy.token is None and policy.read_token is None and policy.allow_unauthenticated:
        return
    if policy.read_token is None:
        _check(policy, creds)  # auth_reads with the write token only: its messages
        return
    if creds is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token: reads need the read token (or the write token): send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    raise HTTPException(status.HTTP_403_FORBIDDEN, "wrong API token")


def authenticated(request: Request) -> bool:
    """Whether this request showed a valid token (set by require_read / require_write)."""
    return bool(getattr(request.state, "authenticated", False))


WriteAuth = Depends(require_write)
ReadAuth = Depends(require_read)
