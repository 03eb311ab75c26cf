"""The doctor's report: the JSON a bug report attaches (`SCHEMA`, checked by the tests) and its table."""

from __future__ import annotations

import datetime
import platform
import socket
from typing import Any

from stare.app.doctor.registry import Context, Row

VERSION = 1
STATUSES = ("pass", "fail", "skip")

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "stare doctor report",
    "type": "object",
    "required": ["version", "created", "host", "seconds", "summary", "checks"],
    "additionalProperties": False,
    "properties": {
        "version": {"const": VERSION},
        "created": {"type": "string", "format": "date-time"},
        "host": {
            "type": "object",
            "required": ["hostname", "python", "platform"],
            "properties": {
                "hostname": {"type": "string"},
                "python": {"type": "string"},
                "platform": {"type": "string"},
            },
            "additionalProperties": False,
        },
        "config": {"type": ["string", "null"]},
        "seconds": {"type": "number", "minimum": 0},
        "summary": {
            "type": "object",
            "required": list(STATUSES),
            "additionalProperties": False,
            "properties": {s: {"type": "integer", "minimum": 0} for s in STATUSES},
        },
        "checks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["check", "status", "why", "figures", "seconds"],
                "additionalProperties": False,
                "properties": {
                    "check": {"type": "string", "pattern": r"^[a-z]+\.[a-z0-9_]+$"},
                    "status": {"enum": list(STATUSES)},
                    "why": {"type": "string"},
                    "figures": {
                        "type": "object",
                        "additionalProperties": {"type": ["number", "string", "boolean", "null"]},
                    },
                    "seconds": {"type": "number", "minimum": 0},
                },
                # a skipped or failed check always says why
                "if": {"properties": {"status": {"enum": ["fail", "skip"]}}},
                "then": {"properties": {"why": {"minLength": 1}}},
            },
        },
    },
}


def build_report(rows: list[Row], seconds: float, ctx: Context) -> dict[str, Any]:
    return {
        "version": VERSION,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": {
            "hostname": socket.gethostname(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "config": ctx.config,
        "seconds": round(seconds, 1),
        "summary": {s: sum(r.status == s for r in rows) for s in STATUSES},
        "checks": [r.to_json() for r in rows],
    }


def _figures(figures: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e4 else f"{v:,.0f}"
        return str(v)

    return ", ".join(f"{k} {fmt(v)}" for k, v in figures.items())


def render(report: dict[str, Any]) -> str:
    """The table (plain text, wide enough for a terminal and a bug report)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"stare doctor: {report['host']['hostname']}", show_lines=False)
    for col in ("check", "status", "s", "figures / why"):
        table.add_column(col, overflow="fold")
    marks = {"pass": "[green]pass[/]", "fail": "[red]FAIL[/]", "skip": "[yellow]skip[/]"}
    for r in report["checks"]:
        detail = "; ".join(x for x in (_figures(r["figures"]), r["why"]) if x)
        table.add_row(r["check"], marks[r["status"]], f"{r['seconds']:.1f}", detail)
    console = Console(width=160, record=True, force_terminal=False)
    with console.capture() as cap:
        console.print(table)
    s = report["summary"]
    return cap.get() + f"{s['pass']} passed, {s['fail']} failed, {s['skip']} skipped in {report['seconds']:.0f} s\n"
