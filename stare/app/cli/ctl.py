"""`stare ctl`: a small HTTP client of the control plane (httpx, timeouts on every call).

    stare ctl status | entropy [--target T --band LO HI --w W --m M --adaptive/--no-adaptive]
              | pause | resume | checkpoint | history [--limit N] | audit [--run]
    --url (default http://127.0.0.1:8321; STARE_CONTROL_URL), --token (default STARE_API_TOKEN)

Prints JSON (or a short table for history); `status` also says on stderr what is down (the phase,
when the learner sends no heartbeat, and each role without one). A non-2xx answer prints the API's
detail and exits 1, an unreachable server exits 2 with the URL it tried.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import sys
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8321"
HISTORY_KEYS = ("step", "entropy", "target", "gate", "w", "m", "reward_mean", "response_length_mean", "control_changes")


class CtlError(Exception):
    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=os.environ.get("STARE_CONTROL_URL", DEFAULT_URL),
        help=f"control plane URL (default: STARE_CONTROL_URL or {DEFAULT_URL})",
    )
    p.add_argument("--token", default=None, help="API token (default: STARE_API_TOKEN)")
    p.add_argument("--timeout-s", type=float, default=10.0, help="timeout of each HTTP call")
    sub = p.add_subparsers(dest="ctl_command", required=True)
    sub.add_parser("status", help="run phase, step, throughput, queues, roles")
    e = sub.add_parser("entropy", help="show the controller, or change it (applied at the next step)")
    e.add_argument("--target", type=float, help="entropy target (nats)")
    e.add_argument("--band", type=float, nargs=2, metavar=("LOW", "HIGH"), help="hysteresis band around the target")
    e.add_argument("--no-band", action="store_true", help="remove the band")
    e.add_argument("--w", type=float, help="W, the weight on L+")
    e.add_argument("--m", type=float, help="M, the weight on L-")
    e.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=None, help="adaptive W/M schedule")
    e.add_argument("--schedule", choices=("sign", "proportional"), help="adaptive schedule of W and M")
    e.add_argument("--alpha", type=float, help="adaptive step size (sign schedule)")
    e.add_argument("--gain", type=float, help="gain of the proportional schedule")
    e.add_argument("--w-max", type=float, help="upper bound of W")
    e.add_argument("--m-min", type=float, help="lower bound of M")
    sub.add_parser("pause", help="pause before the next step")
    sub.add_parser("resume", help="resume a paused run")
    sub.add_parser("checkpoint", help="save a checkpoint at the next step boundary")
    h = sub.add_parser("history", help="recent step metrics")
    h.add_argument("--limit", type=int, default=20, help="how many recent steps")
    h.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = sub.add_parser("audit", help="the log of controller changes")
    a.add_argument("--run", action="store_true", help="the log of pause, resume and checkpoint commands instead")


def entropy_changes(args: argparse.Namespace) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for key in ("target", "w", "m", "adaptive", "schedule", "alpha", "gain", "w_max", "m_min"):
        if getattr(args, key) is not None:
            changes[key] = getattr(args, key)
    if args.band is not None and args.no_band:
        raise CtlError("--band and --no-band exclude each other; give one")
    if args.band is not None:
        changes["band"] = list(args.band)
    elif args.no_band:
        changes["band"] = None
    return changes


def _call(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    import httpx

    token = args.token or os.environ.get("STARE_API_TOKEN") or None
    headers = {"X-Stare-Actor": f"{getpass.getuser()}@{socket.gethostname()} (stare ctl)"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = args.url.rstrip("/") + path
    try:
        response = httpx.request(method, url, json=body, headers=headers, timeout=args.timeout_s)
    except httpx.HTTPError as err:
        raise CtlError(
            f"cannot reach the control plane at {args.url}: {err}; check --url and that it runs", 2
        ) from None
    try:
        data = response.json()
    except ValueError:
        data = {"detail": response.text[:500]}
    if response.is_error:
        detail = data.get("detail", data) if isinstance(data, dict) else data
        raise CtlError(f"{method} {path}: {response.status_code} {detail}")
    return data


def _history_table(items: list[dict[str, Any]]) -> str:
    def cell(v: Any) -> str:
        return f"{v:.4f}" if isinstance(v, float) else ("-" if v is None else str(v))

    lines = ["  ".join(f"{k:>12}" for k in HISTORY_KEYS)]
    lines += ["  ".join(f"{cell(item.get(k)):>12}" for k in HISTORY_KEYS) for item in items]
    return "\n".join(lines)


def down_lines(status: dict[str, Any]) -> list[str]:
    """What /v1/status says is down, one line each for a reader (the JSON follows on stdout)."""
    lines = [f"phase down: {status.get('reason', '')}"] if status.get("phase") == "down" else []
    for r in status.get("roles") or []:
        if r.get("state") == "down":
            lines.append(f"{r['role']}/{r['name']} down: no heartbeat for {r['age_s']:.0f} s (host {r['host']})")
    return lines


def run(args: argparse.Namespace) -> int:
    cmd = args.ctl_command
    try:
        if cmd == "status":
            out = _call(args, "GET", "/v1/status")
            for line in down_lines(out):
                print(f"stare ctl: {line}", file=sys.stderr)
        elif cmd == "entropy":
            changes = entropy_changes(args)
            out = _call(args, "PATCH", "/v1/entropy", changes) if changes else _call(args, "GET", "/v1/entropy")
        elif cmd in ("pause", "resume", "checkpoint"):
            out = _call(args, "POST", f"/v1/run/{cmd}")
        elif cmd == "history":
            page = _call(args, "GET", f"/v1/metrics/history?offset=-{max(args.limit, 1)}&limit={max(args.limit, 1)}")
            if not args.json:
                print(_history_table(page["items"]))
                return 0
            out = page
        else:  # audit
            out = _call(args, "GET", "/v1/run/audit" if args.run else "/v1/entropy/audit")
    except CtlError as err:
        print(f"stare ctl: {err}", file=sys.stderr)
        return err.code
    print(json.dumps(out, indent=2))
    return 0
