"""Container health check of a stare role: exit 0 when its health endpoint answers 200.

The image runs every role, so the check reads the role from the container's command (PID 1):
`stare control` serves GET /v1/health on port 8321 (control_plane.port's default; pass --url for
another); every
other role serves GET /healthz on STARE_HEALTH_PORT. `--url URL` checks URL instead. Standard
library only: it runs in the slim images too. Not a readiness check (that is /v1/ready).
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

CONTROL_PORT = 8321  # stare.config.ControlPlaneSection.port's default (tests/deploy checks it)


def role_of_pid1() -> str:
    """The stare subcommand PID 1 runs ('' when it is not `stare <role>`)."""
    try:
        argv = Path("/proc/1/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    words = [a.decode(errors="replace") for a in argv if a]
    for i, word in enumerate(words):
        if word.endswith("stare") or word == "stare.app.cli":
            return words[i + 1] if i + 1 < len(words) else ""
    return ""


def health_url(role: str) -> str:
    if role == "control":
        return f"http://127.0.0.1:{CONTROL_PORT}/v1/health"
    port = os.environ.get("STARE_HEALTH_PORT")
    if not port:
        raise SystemExit("healthcheck: STARE_HEALTH_PORT is not set, so this role serves no /healthz")
    return f"http://127.0.0.1:{port}/healthz"


def main(argv: list[str]) -> int:
    if "--url" in argv and argv.index("--url") + 1 >= len(argv):
        raise SystemExit("healthcheck: --url needs a value, e.g. --url http://127.0.0.1:8321/v1/health")
    url = argv[argv.index("--url") + 1] if "--url" in argv else health_url(role_of_pid1())
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return 0 if resp.status == 200 else 1
    except OSError as err:
        print(f"healthcheck: {url}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
