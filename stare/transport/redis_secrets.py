"""Where a role's Redis URL (with its password) comes from, and keeping it out of logs.

Redis is closed by default: `stare up` starts its redis-server with a password generated per run,
compose and Kubernetes run Redis with a password from a secret. A role finds its URL, first match
wins: `--redis-url`, `--redis-url-file`, STARE_REDIS_URL_FILE (a file holding the whole URL, e.g.
`redis://:PASSWORD@host:6379/0`), STARE_REDIS_URL, `system.redis_url`; then, when that URL carries no
password, STARE_REDIS_PASSWORD_FILE (a file holding only the password, as a compose secret or a
Kubernetes Secret is mounted) adds it. Secret files are written 0600 and read stripped of surrounding
whitespace; URLs are logged only through `masked`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from stare.config import ConfigError

URL_FILE_ENV = "STARE_REDIS_URL_FILE"
URL_ENV = "STARE_REDIS_URL"
PASSWORD_FILE_ENV = "STARE_REDIS_PASSWORD_FILE"


class SecretError(ConfigError):
    """A secret file is missing or empty (the message names it and what to put there)."""


def read_secret(path: str | Path, what: str) -> str:
    p = Path(path)
    try:
        text = p.read_text().strip()
    except OSError as err:
        raise SecretError(f"{what}: cannot read {p} ({err.strerror}); mount or write the secret there") from None
    if not text:
        raise SecretError(f"{what}: {p} is empty; write the secret into it")
    return text


def write_secret(path: Path, text: str) -> Path:
    """`text` into `path`, created with mode 0600 (never readable by other users, not even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    return path


def with_password(url: str, password: str, username: str | None = None) -> str:
    """`url` with this password (and ACL user) in its authority; the URL's own credentials are replaced."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    netloc = f"{quote(username or '', safe='')}:{quote(password, safe='')}@{host}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def has_password(url: str) -> bool:
    return urlsplit(url).password is not None


def masked(url: str) -> str:
    """`url` safe to log: any password replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


def resolve_url(
    default: str,
    *,
    url: str | None = None,
    url_file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """The role's Redis URL (see the module docstring for the order)."""
    env = os.environ if environ is None else environ
    if url:
        found = url
    elif url_file:
        found = read_secret(url_file, "--redis-url-file")
    elif env.get(URL_FILE_ENV):
        found = read_secret(env[URL_FILE_ENV], URL_FILE_ENV)
    else:
        found = env.get(URL_ENV) or default
    check_url(found)
    if not has_password(found) and env.get(PASSWORD_FILE_ENV):
        found = with_password(found, read_secret(env[PASSWORD_FILE_ENV], PASSWORD_FILE_ENV), urlsplit(found).username)
    return found


def check_url(url: str) -> None:
    """A URL redis-py can connect with: redis://, rediss:// or unix://, a host and a port in range."""
    example = "redis://:PASSWORD@HOST:6379/0"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:
        raise SecretError(f"Redis URL {masked_safely(url)}: {err}; write it as {example}") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise SecretError(
            f"Redis URL {masked_safely(url)}: scheme {parts.scheme or '(none)'!r} is not redis, rediss "
            f"or unix; write it as {example}"
        )
    if parts.scheme != "unix" and not parts.hostname:
        raise SecretError(f"Redis URL {masked_safely(url)}: no host; write it as {example}")
    if parts.scheme != "unix" and parts.path not in ("", "/") and not parts.path.lstrip("/").isdigit():
        raise SecretError(
            f"Redis URL {masked_safely(url)}: database {parts.path.lstrip('/')!r} is not a number; "
            f"write it as {example}"
        )
    del port


def masked_safely(url: str) -> str:
    """`masked(url)`, or a placeholder for a URL too broken to take apart (it may hold a password)."""
    try:
        return masked(url)
    except (ValueError, IndexError):
        return "(unparsable, not shown: it may hold a password)"
