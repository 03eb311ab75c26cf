#!/usr/bin/env python3
"""Before `docker compose up`: would it stop half way on this host? Run it with the same options:

    scripts/compose_preflight.py --profile cpu           # then: docker compose --profile cpu up -d

Compose creates every container before it starts them, so a host port another process holds
(a `stare train` on 8321, a second deployment) fails the start of one service and leaves the others
"Created". This asks `docker compose config` what the selected profiles publish and mount, and
prints one line per problem: a published port in use, naming the process that holds it and the
variable that moves it (STARE_CONTROL_PORT, STARE_PROMETHEUS_PORT, STARE_GRAFANA_PORT), or a secret
file that does not exist (scripts/make_secrets.sh makes them). Ports of this project's own running
containers are not problems. Exit 0: nothing found; 2: problems (printed), or Docker did not answer.

Standard library only (the checks are stare/runtime/net.py, loaded by path): it needs python3 and
the Docker CLI with Compose v2, not stare. Linux names the holder from /proc (as root: any user's).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 60.0


def _net():
    spec = importlib.util.spec_from_file_location("stare_runtime_net", ROOT / "stare" / "runtime" / "net.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compose(args: list[str], *command: str) -> str:
    done = subprocess.run(
        ["docker", "compose", *args, *command], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT
    )
    if done.returncode != 0:
        raise RuntimeError((done.stderr or done.stdout).strip()[-1500:])
    return done.stdout


def main(args: list[str]) -> int:
    try:
        config = json.loads(_compose(args, "config", "--format", "json"))
    except (OSError, RuntimeError, subprocess.TimeoutExpired, ValueError) as err:
        print(f"compose_preflight: `docker compose {' '.join(args)} config` failed: {err}", file=sys.stderr)
        return 2
    try:
        running = _compose(args, "ps", "--status", "running", "--services").split()
    except (OSError, RuntimeError, subprocess.TimeoutExpired):
        running = []
    problems = _net().compose_preflight(config, running)
    for line in problems:
        print(f"compose_preflight: {line}", file=sys.stderr)
    if problems:
        print("compose_preflight: nothing was started; fix the above, then run this again", file=sys.stderr)
        return 2
    ports = len(_net().published_ports(config))
    print(f"compose_preflight: {ports} published port(s) free, every secret file present", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
