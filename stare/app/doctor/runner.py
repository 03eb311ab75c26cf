"""Run the doctor's groups, each in its own process with its time limit; collect, print and save the rows.

A group's process writes its rows as its checks end (stare.app.doctor.worker); when it exits or is
killed at its limit, every check of the group without a row gets a failed one saying why (the time
limit, or the exit code and the end of its stderr). So one check that hangs (an NCCL op, a driver
call) costs its group's limit and nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from stare.app.doctor.registry import GROUPS, Context, Group, Row

LAUNCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def run_group(group: Group, ctx: Context, timeout_s: float | None = None) -> list[Row]:
    """The rows of `group`'s checks, in the order the group declares them."""
    out = Path(ctx.out)
    rows_path, log_path = out / f"{group.name}.rows.jsonl", out / f"{group.name}.log"
    rows_path.unlink(missing_ok=True)
    limit = timeout_s if timeout_s is not None else group.timeout_s
    cmd = [sys.executable, "-m", "stare.app.doctor.worker", group.module, json.dumps(ctx.to_json()), str(rows_path)]
    # a launcher's rendezvous (torchrun's, a test's) is not the doctor's: its checks form their own groups
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV} | {"PYTHONUNBUFFERED": "1"}
    with log_path.open("w", encoding="utf-8") as log:
        # its own session: a kill at the limit takes the group's own subprocesses (ranks, receivers) too
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=limit)
            ended = None if code == 0 else f"its process exited with code {code}: {_tail(log_path)}"
        except subprocess.TimeoutExpired:
            _kill(proc)
            ended = f"its group ({group.name}) did not finish within {limit:.0f} s and was stopped"
    got = {}
    if rows_path.is_file():
        for line in rows_path.read_text(encoding="utf-8").splitlines():
            data = json.loads(line)
            got[data["check"]] = Row(**data)
    rows = []
    for check in group.checks():
        rows.append(got.pop(check.name, None) or Row(check.name, "fail", f"no result: {ended or 'not reported'}"))
    return rows + list(got.values())  # a row no CHECKS entry declares: kept, the schema test catches it


def _kill(proc: subprocess.Popen) -> None:
    import contextlib
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group's session: its process and its children
    proc.wait(timeout=30)


def _tail(path: Path, n: int = 400) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").strip()
    return " ".join(text[-n:].split())


def run_doctor(ctx: Context, groups: list[str] | None = None, say: Callable[[str], None] = print) -> dict:
    """Every group (or the named ones) in turn; returns the report (stare.app.doctor.report)."""
    from stare.app.doctor.report import build_report

    Path(ctx.out).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows: list[Row] = []
    for name in groups or list(GROUPS):
        group = GROUPS[name]
        say(f"doctor: {group.name} ({group.summary}) ...")
        rows += run_group(group, ctx)
    return build_report(rows, time.perf_counter() - t0, ctx)
