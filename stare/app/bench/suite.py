"""`stare bench`: run the registered benchmarks, print one table, optionally write JSON.

Each benchmark runs in a child process of its own (`python -m stare.app.bench.suite --one NAME`),
with a time limit: process-wide state (torch threads, a default process group, environment
variables DeepSpeed sets) cannot leak from one benchmark into the next, and one that crashes or
hangs becomes an error row while the others still run. Its output goes to a log file, whose tail
the error row quotes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from stare.app.bench.registry import BENCHMARKS

TIMEOUT_S = {True: 900.0, False: 3600.0}  # per benchmark, --quick or not
LAUNCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def run_one(name: str, quick: bool) -> list[dict[str, Any]]:
    """Run one benchmark in this process; an exception becomes an error row."""
    from stare.app.bench.common import failed

    bench = BENCHMARKS[name]
    try:
        rows = bench.run(quick)
    except Exception as err:
        traceback.print_exc()
        return [failed(name, bench.summary, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")]
    if not rows:
        return [failed(name, bench.summary, "the benchmark returned no rows")]
    return rows


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d's store-wait chatter
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    return env


def run_isolated(
    name: str, quick: bool, workdir: Path, timeout_s: float, say: Callable[[str], None] = lambda s: None
) -> list[dict[str, Any]]:
    """Run one benchmark in a child process; its rows, or an error row quoting its log (whose last
    lines also go to `say`)."""
    from stare.app.bench.common import failed

    rows_path, log_path = workdir / f"{name}.json", workdir / f"{name}.log"
    cmd = [sys.executable, "-m", "stare.app.bench.suite", "--one", name, "--rows-out", str(rows_path)]
    cmd += ["--quick"] if quick else []
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=_child_env(), timeout=timeout_s)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = None
    lines = log_path.read_text(errors="replace").strip().splitlines()
    tail = " | ".join(lines[-6:])
    if code != 0 or not rows_path.is_file() or '"error"' in rows_path.read_text():
        say(f"[bench] {name}: the last lines of its output:\n" + "\n".join(lines[-40:]))
    if code is None:
        return [failed(name, BENCHMARKS[name].summary, f"did not finish within {timeout_s:.0f}s; log: {tail}")]
    if code != 0 or not rows_path.is_file():
        return [failed(name, BENCHMARKS[name].summary, f"exited with {code}; log: {tail}")]
    rows = json.loads(rows_path.read_text())
    for r in rows:
        if r.get("error"):
            r["error"] += f"; log: {tail}"
    return rows


def _cpu_time(children: bool) -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _summary(rows: list[dict[str, Any]]) -> str:
    errors = sum(1 for r in rows if r.get("error"))
    skipped = sum(1 for r in rows if r.get("skipped"))
    met = sum(1 for r in rows if r["pass"] is True)
    missed = [r["name"] for r in rows if r["pass"] is False]
    parts = [f"{met} met"]
    if missed:
        parts.append(f"{len(missed)} missed ({', '.join(missed)})")
    if skipped:
        parts.append(f"{skipped} skipped")
    if errors:
        parts.append(f"{errors} failed")
    return ", ".join(parts)


def run_suite(
    names: list[str],
    *,
    quick: bool,
    json_path: Path | None = None,
    isolate: bool = True,
    timeout_s: float | None = None,
    out: TextIO = sys.stdout,
    say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> list[dict[str, Any]]:
    """Run `names` in order; print the table to `out` and write `json_path`; returns every row."""
    from stare.app.bench.common import format_table, machine

    started, t_start = datetime.datetime.now(datetime.UTC), time.perf_counter()
    host = machine()
    load = f", load {host['load_avg_1_5_15'][0]:.1f}" if host["load_avg_1_5_15"] else ""
    say(f"[bench] {len(names)} benchmark(s){' (quick)' if quick else ''} on {host['cpu']}, {host['cores']} cores{load}")
    rows: list[dict[str, Any]] = []
    seconds: dict[str, float] = {}
    cpu_seconds: dict[str, float] = {}  # CPU time of the benchmark's processes: its work, whatever the load
    with tempfile.TemporaryDirectory(prefix="stare-bench-") as tmp:
        for name in names:
            t0, c0 = time.perf_counter(), _cpu_time(isolate)
            got = (
                run_isolated(name, quick, Path(tmp), timeout_s or TIMEOUT_S[quick], say)
                if isolate
                else run_one(name, quick)
            )
            seconds[name], cpu_seconds[name] = time.perf_counter() - t0, _cpu_time(isolate) - c0
            say(f"[bench] {name}: {_summary(got)} ({seconds[name]:.0f}s, {cpu_seconds[name]:.0f} CPU s)")
            rows += got
    wall = time.perf_counter() - t_start
    table = format_table(rows)
    print(table, file=out)
    print(f"\n{_summary(rows)}; {wall:.0f}s", file=out)
    if json_path is not None:
        result = {
            "command": " ".join(["stare", "bench", *sys.argv[2:]]) if sys.argv[1:2] == ["bench"] else None,
            "benchmarks": names,
            "quick": quick,
            "started_utc": started.isoformat(timespec="seconds"),
            "wall_s": wall,
            "seconds": seconds,
            "cpu_seconds": cpu_seconds,
            "machine": host,
            "load_avg_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "rows": rows,
            "table": table,
        }
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=1, default=str) + "\n")
        say(f"[bench] results: {json_path}")
    return rows


def _one(argv: list[str]) -> int:
    """The child process: one benchmark, rows to --rows-out."""
    p = argparse.ArgumentParser(prog="python -m stare.app.bench.suite")
    p.add_argument("--one", required=True, choices=sorted(BENCHMARKS))
    p.add_argument("--rows-out", type=Path, required=True)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    rows = run_one(args.one, args.quick)
    args.rows_out.write_text(json.dumps(rows, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(_one(sys.argv[1:]))
