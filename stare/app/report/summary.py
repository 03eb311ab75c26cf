"""One run's headline numbers from its metrics.jsonl and eval.jsonl (`summarize`) and their
Markdown (`summary_markdown`)."""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from pathlib import Path
from typing import Any

from stare.observe.files import read_jsonl

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.jsonl"
REPORT_DIR = "report"
# Without a logged band, "in band" means within this relative distance of the target.
IMPLIED_BAND_REL = 0.2
# "Final" entropy is the mean over this fraction of the last steps (at least one step).
FINAL_FRACTION = 0.1
EMA_BETA = 0.8

SUMMARY_KEYS = (
    "run", "algo", "steps", "last_step", "wall_time_s",
    "entropy_first", "entropy_last", "entropy_min", "entropy_final", "target_last",
    "band_source", "band_last", "first_in_band_step", "in_band_fraction", "gate_on_fraction",
    "reward_first", "reward_last", "tokens_per_s_mean",
    "evals", "k", "greedy_accuracy_first", "greedy_accuracy_last",
    "pass_at_k_first", "pass_at_k_last", "avg_at_k_last", "per_level_last", "per_source_last",
    "w_final", "m_final", "machine",
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Reading


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    """Objects of a JSON-lines file, in order; `[]` if the file does not exist. A damaged line (not UTF-8,
    not JSON, not an object) is skipped with a warning naming the file and its 1-based line, the rest
    kept; an unfinished last line (no newline yet: the run is writing it) is skipped silently
    (stare.observe.files.read_jsonl)."""
    return read_jsonl(path, log.warning)


def _number(x: Any) -> float | None:
    """`x` as a finite float (bools count: gate may be logged as true/false), else None."""
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, (int, float)) and math.isfinite(x):
        return float(x)
    return None


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the rows where `key` is a finite number; a row without `step` counts as
    its 1-based position."""
    steps, values = [], []
    for i, row in enumerate(rows):
        v = _number(row.get(key))
        if v is not None:
            steps.append(float(row.get("step", i + 1)))
            values.append(v)
    return steps, values


def _row_band(row: dict[str, Any]) -> tuple[float, float, str] | None:
    """(low, high, source) of one step's band: `[band_low, band_high]` when both are logged
    ("logged"), else `target * (1 -+ IMPLIED_BAND_REL)` ("implied"); None without either."""
    low, high, target = _number(row.get("band_low")), _number(row.get("band_high")), _number(row.get("target"))
    if low is not None and high is not None:
        return low, high, "logged"
    if target is not None:
        return target * (1 - IMPLIED_BAND_REL), target * (1 + IMPLIED_BAND_REL), "implied"
    return None


def _bands(rows: list[dict[str, Any]]) -> tuple[list[float], list[float], list[float], str | None]:
    """Per-step (steps, low, high) of the rows that have a band, and where the bands came from:
    "logged", "implied", "mixed", or None when no row has one."""
    steps, lows, highs, sources = [], [], [], set()
    for i, row in enumerate(rows):
        band = _row_band(row)
        if band is not None:
            steps.append(float(row.get("step", i + 1)))
            lows.append(band[0])
            highs.append(band[1])
            sources.add(band[2])
    source = None if not sources else sources.pop() if len(sources) == 1 else "mixed"
    return steps, lows, highs, source


# ---------------------------------------------------------------------------------------------
# Numbers


def ema(values: list[float], beta: float = EMA_BETA) -> list[float]:
    """Exponential moving average, started at the first value (no bias toward zero)."""
    out: list[float] = []
    for v in values:
        out.append(v if not out else beta * out[-1] + (1 - beta) * v)
    return out


def _final_mean(values: list[float]) -> float | None:
    """Mean of the last FINAL_FRACTION of `values` (at least one value)."""
    if not values:
        return None
    n = max(1, math.ceil(FINAL_FRACTION * len(values)))
    return sum(values[-n:]) / n


def _in_band(rows: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(first step whose entropy is inside its band, fraction of steps in band from that step on).

    Bounds are inclusive; steps without an entropy or a band are not counted. (None, 0.0) when the
    entropy never entered a band it had (a run that stays outside is 0% in band, not unknown); (None,
    None) when no step has both."""
    checked = []  # (step, inside) per step that has both an entropy and a band
    for i, row in enumerate(rows):
        h, band = _number(row.get("entropy")), _row_band(row)
        if h is not None and band is not None:
            checked.append((float(row.get("step", i + 1)), band[0] <= h <= band[1]))
    first = next((i for i, (_, inside) in enumerate(checked) if inside), None)
    if first is None:
        return None, (0.0 if checked else None)
    after = [inside for _, inside in checked[first:]]
    return checked[first][0], sum(after) / len(after)


def _first(values: list[float]) -> float | None:
    return values[0] if values else None


def _last(values: list[float]) -> float | None:
    return values[-1] if values else None


def _machine(run_dir: Path) -> dict[str, Any] | None:
    """machine.json (stare.observe.machine: model hash, torch kernels, packages), None when absent."""
    path = run_dir / "machine.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except json.JSONDecodeError:
        return None


def machine_line(m: dict[str, Any] | None) -> str:
    """One line naming what a run ran on (model hash prefix, torch, CPU capability, threads, cpu)."""
    if not m:
        return "n/a (no machine.json)"
    t, model = m.get("torch", {}), m.get("model", {})
    digest = (model.get("sha256") or "none")[:12]
    return (
        f"model sha256 {digest}, torch {t.get('version')} ({t.get('cpu_capability')}, mkl {t.get('mkl')}, "
        f"onednn {t.get('mkldnn')}, {t.get('threads')} threads), transformers "
        f"{m.get('packages', {}).get('transformers')}, {m.get('cpu')}"
    )


def summarize(run_dir: Path) -> dict[str, Any]:
    """The run's headline numbers, keyed by `SUMMARY_KEYS`; a number without data is None.

    `steps` counts metrics lines; `wall_time_s` sums `time_step_s`; `entropy_final` is the mean
    over the last 10% of steps; `in_band_fraction` counts steps from the first one whose entropy is
    inside the band (see `_bands` for the band when none is logged); `*_first` / `*_last` of
    held-out numbers are the first and last evaluations."""
    run_dir = Path(run_dir)
    metrics = load_jsonl(run_dir / METRICS_FILE)
    evals = load_jsonl(run_dir / EVAL_FILE)
    algos = Counter(r["algo"] for r in metrics if isinstance(r.get("algo"), str))
    steps = _series(metrics, "step")[1] or [float(i + 1) for i in range(len(metrics))]
    time_s = _series(metrics, "time_step_s")[1]
    entropy = _series(metrics, "entropy")[1]
    gate = _series(metrics, "gate")[1]
    reward = _series(metrics, "reward_mean")[1]
    tps = _series(metrics, "tokens_per_s")[1]
    first_in_band, in_band = _in_band(metrics)
    bands = _bands(metrics)
    greedy = _series(evals, "greedy_accuracy")[1]
    pass_k = _series(evals, "pass_at_k")[1]
    k = _last(_series(evals, "k")[1])
    per_level = next((r["per_level"] for r in reversed(evals) if isinstance(r.get("per_level"), dict)), None)
    summary = {
        "run": run_dir.name,
        "algo": algos.most_common(1)[0][0] if algos else None,
        "steps": len(metrics),
        "last_step": int(steps[-1]) if steps else None,
        "wall_time_s": sum(time_s) if time_s else None,
        "entropy_first": _first(entropy),
        "entropy_last": _last(entropy),
        "entropy_min": min(entropy) if entropy else None,
        "entropy_final": _final_mean(entropy),
        "target_last": _last(_series(metrics, "target")[1]),
        "band_source": bands[3],
        "band_last": [bands[1][-1], bands[2][-1]] if bands[1] else None,
        "first_in_band_step": None if first_in_band is None else int(first_in_band),
        "in_band_fraction": in_band,
        "gate_on_fraction": sum(g > 0 for g in gate) / len(gate) if gate else None,
        "reward_first": _first(reward),
        "reward_last": _last(reward),
        "tokens_per_s_mean": sum(tps) / len(tps) if tps else None,
        "evals": len(evals),
        "k": None if k is None else int(k),
        "greedy_accuracy_first": _first(greedy),
        "greedy_accuracy_last": _last(greedy),
        "pass_at_k_first": _first(pass_k),
        "pass_at_k_last": _last(pass_k),
        "avg_at_k_last": _last(_series(evals, "avg_at_k")[1]),
        "per_level_last": per_level,
        "per_source_last": next(
            (r["per_source"] for r in reversed(evals) if isinstance(r.get("per_source"), dict)), None
        ),
        "w_final": _last(_series(metrics, "w")[1]),
        "m_final": _last(_series(metrics, "m")[1]),
        "machine": _machine(run_dir),
    }
    assert tuple(summary) == SUMMARY_KEYS
    return summary


# ---------------------------------------------------------------------------------------------
# Formatting


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _fmt_pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _fmt_duration(s: float | None) -> str:
    if s is None:
        return "n/a"
    whole = int(round(s))
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m {whole % 60:02d}s ({s:.1f} s)"


def _band_text(s: dict[str, Any]) -> str:
    band = s.get("band_last")
    note = _band_note(s["band_source"])
    return note if band is None else f"[{_fmt(band[0])}, {_fmt(band[1])}]: {note}"


def _band_note(source: str | None) -> str:
    implied = f"target ±{IMPLIED_BAND_REL:.0%} (no band logged)"
    return {"logged": "[band_low, band_high] as logged", "implied": implied,
            "mixed": f"logged where present, else {implied}", None: "none (no target logged)"}[source]  # fmt: skip


def _summary_markdown(s: dict[str, Any]) -> str:
    k = s["k"] if s["k"] is not None else "k"
    rows = [
        ("algorithm", _fmt(s["algo"])),
        ("steps (last step)", f"{s['steps']} ({_fmt(s['last_step'])})"),
        ("wall time (sum of time_step_s)", _fmt_duration(s["wall_time_s"])),
        ("entropy first / last / min (nats)",
         f"{_fmt(s['entropy_first'])} / {_fmt(s['entropy_last'])} / {_fmt(s['entropy_min'])}"),
        (f"entropy final (mean of last {FINAL_FRACTION:.0%} of steps)", _fmt(s["entropy_final"])),
        ("entropy target (last)", _fmt(s["target_last"])),
        ("band (last)", _band_text(s)),
        ("first step in band", _fmt(s["first_in_band_step"])),
        ("steps in band after first entering it", _fmt_pct(s["in_band_fraction"])),
        ("gate on (fraction of steps)", _fmt_pct(s["gate_on_fraction"])),
        ("train reward first / last", f"{_fmt(s['reward_first'])} / {_fmt(s['reward_last'])}"),
        ("tokens/s (mean)", _fmt(s["tokens_per_s_mean"], 1)),
        ("held-out evaluations", str(s["evals"])),
        ("held-out greedy accuracy first / last",
         f"{_fmt(s['greedy_accuracy_first'])} / {_fmt(s['greedy_accuracy_last'])}"),
        (f"held-out pass@{k} first / last", f"{_fmt(s['pass_at_k_first'])} / {_fmt(s['pass_at_k_last'])}"),
        (f"held-out avg@{k} last", _fmt(s["avg_at_k_last"])),
        ("final W / M", f"{_fmt(s['w_final'])} / {_fmt(s['m_final'])}"),
        ("machine (machine.json)", machine_line(s["machine"])),
    ]  # fmt: skip
    lines = [f"# Run report: {s['run']}", "", "![report](report.png)", "", "| quantity | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    if s["per_level_last"]:
        lines += ["", "## Held-out greedy accuracy per level (last evaluation)", ""]
        lines += ["| level | accuracy |", "|---|---|"]
        lines += [f"| {lvl} | {_fmt(_number(acc))} |" for lvl, acc in s["per_level_last"].items()]
    if s["per_source_last"]:
        lines += ["", "## Held-out per data source (last evaluation)", ""]
        lines += [
            "| source | problems | n | temperature | top_p | avg@n | pass@n | greedy |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {src} | {v.get('problems')} | {v.get('n')} | {_fmt(v.get('temperature'), 2)} | {_fmt(v.get('top_p'), 2)} "
            f"| {_fmt(v.get('avg_at_n'))} | {_fmt(v.get('pass_at_n'))} | {_fmt(v.get('greedy_accuracy'))} |"
            for src, v in s["per_source_last"].items()
            if isinstance(v, dict)
        ]
    lines += [
        "",
        f"In-band fraction: from the first step whose entropy lies in the band (bounds inclusive), the "
        f"fraction of steps whose entropy lies in that step's band. Band: {_band_note(s['band_source'])}.",
        "",
    ]
    return "\n".join(lines)
