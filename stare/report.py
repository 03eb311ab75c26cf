"""End-of-run report for one run and the comparison figure for several runs.

A training run writes `runs/<name>/metrics.jsonl` (one object per optimizer step) and
`runs/<name>/eval.jsonl` (one object per held-out evaluation). From those files:

- `summarize(run_dir)` computes the run's headline numbers as a dict (see `SUMMARY_KEYS`);
- `write_report(run_dir)` writes `run_dir/report/`: `report.png` (all panels), one PNG per panel
  and `summary.md`;
- `compare(run_dirs)` groups runs by `algo` (seeds of the same algorithm) and computes one table
  row per algorithm;
- `write_comparison(run_dirs, out_dir)` writes `out_dir/compare.png` and `out_dir/compare.md`.

Limits: the files are read once, as they are; a run still writing is reported up to its last
complete line (a truncated last line is skipped, a malformed line elsewhere is an error). Any key
may be missing or null: the number that needs it is `None` ("n/a" in Markdown) and its curve is
left out. Smoothing (an EMA overlay) is for display only; every number in the summaries is
computed from the raw values. Figures are drawn on `matplotlib.figure.Figure` objects rendered by
Agg, so nothing touches the global pyplot backend or state of a caller.

Run from the shell: `python -m stare.report runs/a` (one report per run directory given) or
`python -m stare.report runs/a runs/b --compare out/` (the comparison).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # matplotlib is imported inside the functions that draw
    from matplotlib.axes import Axes

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
    "w_final", "m_final",
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Reading


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    """Objects of a JSON-lines file, in order; `[]` if the file does not exist.

    Blank lines are skipped. A last line that does not parse is taken as a write cut short (the run
    is still going or was killed) and skipped; a bad line before the last raises ValueError naming
    the file and line."""
    if not path.exists():
        return []
    lines = [(i, line) for i, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    rows = []
    for pos, (lineno, line) in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if pos == len(lines) - 1:
                break
            raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg}); fix or remove the line") from e
    return rows


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

    Bounds are inclusive; steps without an entropy or a band are not counted. (None, None) when the
    entropy never entered the band."""
    checked = []  # (step, inside) per step that has both an entropy and a band
    for i, row in enumerate(rows):
        h, band = _number(row.get("entropy")), _row_band(row)
        if h is not None and band is not None:
            checked.append((float(row.get("step", i + 1)), band[0] <= h <= band[1]))
    first = next((i for i, (_, inside) in enumerate(checked) if inside), None)
    if first is None:
        return None, None
    after = [inside for _, inside in checked[first:]]
    return checked[first][0], sum(after) / len(after)


def _first(values: list[float]) -> float | None:
    return values[0] if values else None


def _last(values: list[float]) -> float | None:
    return values[-1] if values else None


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
        "per_source_last": next((r["per_source"] for r in reversed(evals) if isinstance(r.get("per_source"), dict)), None),
        "w_final": _last(_series(metrics, "w")[1]),
        "m_final": _last(_series(metrics, "m")[1]),
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
    ]  # fmt: skip
    lines = [f"# Run report: {s['run']}", "", "![report](report.png)", "", "| quantity | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    if s["per_level_last"]:
        lines += ["", "## Held-out greedy accuracy per level (last evaluation)", ""]
        lines += ["| level | accuracy |", "|---|---|"]
        lines += [f"| {lvl} | {_fmt(_number(acc))} |" for lvl, acc in s["per_level_last"].items()]
    if s["per_source_last"]:
        lines += ["", "## Held-out per data source (last evaluation)", ""]
        lines += ["| source | problems | n | temperature | top_p | avg@n | pass@n | greedy |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {src} | {v.get('problems')} | {v.get('n')} | {_fmt(v.get('temperature'), 2)} | {_fmt(v.get('top_p'), 2)} "
                  f"| {_fmt(v.get('avg_at_n'))} | {_fmt(v.get('pass_at_n'))} | {_fmt(v.get('greedy_accuracy'))} |"
                  for src, v in s["per_source_last"].items() if isinstance(v, dict)]
    lines += [
        "",
        f"In-band fraction: from the first step whose entropy lies in the band (bounds inclusive), the "
        f"fraction of steps whose entropy lies in that step's band. Band: {_band_note(s['band_source'])}.",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Drawing one run


def _raw_and_ema(ax: Axes, steps: list[float], values: list[float], color: str, label: str) -> None:
    """Raw values as faint points, the EMA as a line (labelled)."""
    ax.plot(steps, values, ".", color=color, alpha=0.3, markersize=3)
    ax.plot(steps, ema(values), "-", color=color, linewidth=1.6, label=f"{label} (EMA {EMA_BETA})")


def _no_data(ax: Axes, title: str, text: str) -> None:
    """An empty panel that says what is missing (no ticks, so it cannot be read as data)."""
    ax.set(title=title, xticks=[], yticks=[])
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")


def _shade_gate(ax: Axes, metrics: list[dict[str, Any]]) -> None:
    """Shade contiguous runs of gate-on steps (each step covers [step - 0.5, step + 0.5])."""
    spans: list[list[float]] = []
    for s, g in zip(*_series(metrics, "gate")):
        if g <= 0:
            continue
        if spans and s - spans[-1][1] <= 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    for i, (a, b) in enumerate(spans):
        ax.axvspan(a - 0.5, b + 0.5, color="tab:red", alpha=0.10, linewidth=0, label="gate on" if i == 0 else None)


def _plot_entropy(ax: Axes, metrics: list[dict[str, Any]]) -> None:
    steps, h = _series(metrics, "entropy")
    if not steps:
        return _no_data(ax, "Policy entropy", "no entropy logged")
    band_steps, lows, highs, source = _bands(metrics)
    if band_steps:
        label = "band" if source == "logged" else f"target ±{IMPLIED_BAND_REL:.0%} (no band logged)"
        ax.fill_between(band_steps, lows, highs, step="mid", color="tab:green", alpha=0.18, linewidth=0, label=label)
    target = _series(metrics, "target")
    if target[0]:
        ax.plot(*target, "--", color="tab:green", linewidth=1.2, label="target")
    _shade_gate(ax, metrics)
    _raw_and_ema(ax, steps, h, "tab:blue", "entropy")
    ax.set(title="Policy entropy", xlabel="step", ylabel="mean token entropy (nats)")
    ax.legend(fontsize=8, loc="best")


def _plot_reward(ax: Axes, metrics: list[dict[str, Any]]) -> None:
    drawn = False
    for key, color, label in (("reward_mean", "tab:purple", "reward"), ("accuracy", "tab:orange", "train accuracy")):
        steps, values = _series(metrics, key)
        if steps:
            _raw_and_ema(ax, steps, values, color, label)
            drawn = True
    if not drawn:
        return _no_data(ax, "Training reward", "no reward or accuracy logged")
    ax.set(title="Training reward", xlabel="step", ylabel="mean reward / fraction correct")
    ax.legend(fontsize=8, loc="best")


def _plot_heldout(ax: Axes, evals: list[dict[str, Any]]) -> None:
    k = _last(_series(evals, "k")[1])
    k_txt = "k" if k is None else str(int(k))
    drawn = False
    for key, marker, label in (("greedy_accuracy", "o-", "greedy accuracy"), ("pass_at_k", "s-", f"pass@{k_txt}"),
                               ("avg_at_k", "^--", f"avg@{k_txt}")):  # fmt: skip
        steps, values = _series(evals, key)
        if steps:
            ax.plot(steps, values, marker, markersize=4, linewidth=1.4, label=label)
            drawn = True
    if not drawn:
        return _no_data(ax, "Held-out evaluation", "no held-out evaluations")
    ax.set(title="Held-out evaluation", xlabel="step", ylabel="accuracy", ylim=(-0.02, 1.02))
    ax.legend(fontsize=8, loc="best")


def _plot_length(ax: Axes, metrics: list[dict[str, Any]]) -> None:
    steps, values = _series(metrics, "response_length_mean")
    if not steps:
        return _no_data(ax, "Response length", "no response length logged")
    _raw_and_ema(ax, steps, values, "tab:brown", "mean response length")
    ax.set(title="Response length", xlabel="step", ylabel="tokens")
    ax.legend(fontsize=8, loc="best")


def _plot_controller(ax: Axes, metrics: list[dict[str, Any]]) -> None:
    gate = _series(metrics, "gate")[1]
    w, m = _series(metrics, "w"), _series(metrics, "m")
    if not gate and not w[0] and not m[0]:
        return _no_data(ax, "Controller", "no gate, W or M logged (baseline run)")
    _shade_gate(ax, metrics)
    if w[0]:
        ax.plot(*w, "-", color="tab:red", linewidth=1.4, label="W (L+: positive advantage, high surprisal)")
    if m[0]:
        ax.plot(*m, "-", color="tab:cyan", linewidth=1.4, label="M (L-: negative advantage, high surprisal)")
    on = f", gate on {sum(g > 0 for g in gate) / len(gate):.0%} of steps" if gate else ""
    ax.set(title=f"Controller{on}", xlabel="step", ylabel="W / M")
    if gate and not w[0] and not m[0]:  # only the gate: give the axis the gate's 0/1 scale
        ax.set(ylim=(0, 1), ylabel="gate")
    ax.legend(fontsize=8, loc="best")


def _plot_summary_text(ax: Axes, s: dict[str, Any]) -> None:
    ax.axis("off")
    text = "\n".join([
        f"run: {s['run']}   algo: {_fmt(s['algo'])}",
        f"steps: {s['steps']}   wall time: {_fmt_duration(s['wall_time_s'])}",
        f"entropy first/last/min: {_fmt(s['entropy_first'], 3)} / {_fmt(s['entropy_last'], 3)} / "
        f"{_fmt(s['entropy_min'], 3)}",
        f"in band after entering: {_fmt_pct(s['in_band_fraction'])}   gate on: {_fmt_pct(s['gate_on_fraction'])}",
        f"band: {_band_note(s['band_source'])}",
        f"held-out greedy first/last: {_fmt(s['greedy_accuracy_first'], 3)} / {_fmt(s['greedy_accuracy_last'], 3)}",
        f"held-out pass@{s['k'] or 'k'} first/last: {_fmt(s['pass_at_k_first'], 3)} / {_fmt(s['pass_at_k_last'], 3)}",
        f"final W / M: {_fmt(s['w_final'], 3)} / {_fmt(s['m_final'], 3)}",
    ])  # fmt: skip
    ax.text(0.02, 0.95, text, va="top", ha="left", family="monospace", fontsize=9, transform=ax.transAxes)


def write_report(run_dir: Path) -> Path:
    """Write `run_dir/report/` (report.png, entropy/reward/heldout/response_length/controller.png,
    summary.md) and return that directory."""
    from matplotlib.figure import Figure  # rendered by Agg on savefig; no pyplot state

    run_dir = Path(run_dir)
    out = run_dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    metrics = load_jsonl(run_dir / METRICS_FILE)
    evals = load_jsonl(run_dir / EVAL_FILE)
    summary = summarize(run_dir)
    panels = {
        "entropy": lambda ax: _plot_entropy(ax, metrics),
        "reward": lambda ax: _plot_reward(ax, metrics),
        "heldout": lambda ax: _plot_heldout(ax, evals),
        "response_length": lambda ax: _plot_length(ax, metrics),
        "controller": lambda ax: _plot_controller(ax, metrics),
    }
    fig = Figure(figsize=(15, 12), layout="constrained")
    axes = fig.subplots(3, 2).ravel()
    for ax, draw in zip(axes, panels.values()):
        draw(ax)
    _plot_summary_text(axes[-1], summary)
    fig.suptitle(f"{summary['run']} ({_fmt(summary['algo'])})", fontsize=14)
    fig.savefig(out / "report.png", dpi=100)
    for name, draw in panels.items():
        fig = Figure(figsize=(8, 4.5), layout="constrained")
        draw(fig.subplots())
        fig.savefig(out / f"{name}.png", dpi=100)
    (out / "summary.md").write_text(_summary_markdown(summary))
    return out


# ---------------------------------------------------------------------------------------------
# Comparing runs


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof=1) across seeds; std is None for one seed."""
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _group_by_algo(run_dirs: list[Path]) -> dict[str, list[tuple[Path, dict[str, Any]]]]:
    """algo -> (run dir, summary) of its runs, algos in order of first appearance; a run without
    `algo` is grouped under "unknown"."""
    groups: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    for run_dir in map(Path, run_dirs):
        s = summarize(run_dir)
        groups.setdefault(s["algo"] or "unknown", []).append((run_dir, s))
    return groups


def compare(run_dirs: list[Path]) -> list[dict[str, Any]]:
    """One row per algo: seeds (number of runs), runs (their names), final entropy and final
    held-out greedy accuracy as mean and sample std across seeds, mean in-band fraction and mean
    wall time. Each statistic is over the runs that have the number; None when none has it."""
    return _compare_rows(_group_by_algo(run_dirs))


def _compare_rows(groups: dict[str, list[tuple[Path, dict[str, Any]]]]) -> list[dict[str, Any]]:
    rows = []
    for algo, runs in groups.items():
        summaries = [s for _, s in runs]

        def have(key: str) -> list[float]:
            return [s[key] for s in summaries if s[key] is not None]

        h_mean, h_std = _mean_std(have("entropy_final"))
        acc_mean, acc_std = _mean_std(have("greedy_accuracy_last"))
        rows.append({
            "algo": algo,
            "seeds": len(summaries),
            "runs": [s["run"] for s in summaries],
            "entropy_final_mean": h_mean,
            "entropy_final_std": h_std,
            "greedy_accuracy_final_mean": acc_mean,
            "greedy_accuracy_final_std": acc_std,
            "in_band_fraction_mean": _mean_std(have("in_band_fraction"))[0],
            "wall_time_s_mean": _mean_std(have("wall_time_s"))[0],
        })  # fmt: skip
    return rows


def _pm(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.4f}" if std is None else f"{mean:.4f} ± {std:.4f}"


def _compare_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "# Comparison", "", "![compare](compare.png)", "",
        "| algo | seeds | final entropy (nats) | final held-out greedy acc. | in-band fraction | wall time |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['algo']} | {r['seeds']} | {_pm(r['entropy_final_mean'], r['entropy_final_std'])} "
            f"| {_pm(r['greedy_accuracy_final_mean'], r['greedy_accuracy_final_std'])} "
            f"| {_fmt_pct(r['in_band_fraction_mean'])} | {_fmt_duration(r['wall_time_s_mean'])} |"
        )
    lines += [
        "",
        f"Mean ± sample std (ddof=1) across seeds. Final entropy: mean over the last {FINAL_FRACTION:.0%} of "
        "steps of each run. Final held-out accuracy: last evaluation of each run. In-band fraction and wall "
        "time: mean across seeds. Runs per algo: "
        + "; ".join(f"{r['algo']}: {', '.join(r['runs'])}" for r in rows),
        "",
    ]
    return "\n".join(lines)


def _aggregate(series: list[tuple[list[float], list[float]]]) -> tuple[list[float], ...]:
    """Per step over the runs that have it: (steps, mean, min, max)."""
    at: dict[float, list[float]] = {}
    for steps, values in series:
        for s, v in zip(steps, values):
            at.setdefault(s, []).append(v)
    steps = sorted(at)
    return (steps, [sum(at[s]) / len(at[s]) for s in steps], [min(at[s]) for s in steps], [max(at[s]) for s in steps])


def write_comparison(run_dirs: list[Path], out_dir: Path) -> Path:
    """Write `out_dir/compare.png` (entropy, reward, held-out greedy accuracy side by side; per
    algo the mean across seeds with the min-max range shaded) and `out_dir/compare.md` (the table
    of `compare`); return `out_dir`. Entropy and reward are EMA-smoothed per run before averaging;
    held-out accuracy is plotted raw."""
    from matplotlib.figure import Figure  # rendered by Agg on savefig; no pyplot state

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    groups = _group_by_algo(run_dirs)
    rows = _compare_rows(groups)
    by_algo = {algo: [d for d, _ in runs] for algo, runs in groups.items()}
    panels = (
        ("entropy", METRICS_FILE, True, "Policy entropy", "mean token entropy (nats)"),
        ("reward_mean", METRICS_FILE, True, "Training reward", "mean reward"),
        ("greedy_accuracy", EVAL_FILE, False, "Held-out greedy accuracy", "accuracy"),
    )
    fig = Figure(figsize=(17, 5), layout="constrained")
    axes = fig.subplots(1, 3)
    for ax, (key, file, smooth, title, ylabel) in zip(axes, panels):
        for i, (algo, dirs) in enumerate(by_algo.items()):
            series = [_series(load_jsonl(d / file), key) for d in dirs]
            series = [(s, ema(v) if smooth else v) for s, v in series if s]
            if not series:
                continue
            steps, mean, lo, hi = _aggregate(series)
            color = f"C{i % 10}"
            ax.fill_between(steps, lo, hi, color=color, alpha=0.2, linewidth=0)
            marker = "-" if smooth else "o-"
            ax.plot(steps, mean, marker, color=color, markersize=4, label=f"{algo} (n={len(dirs)})")
        if not ax.lines:
            _no_data(ax, title, f"no {key} logged")
            continue
        targets = {s["target_last"] for runs in groups.values() for _, s in runs} - {None}
        if key == "entropy" and len(targets) == 1:  # one target for all runs: draw it
            ax.axhline(targets.pop(), color="0.3", linestyle="--", linewidth=1.0, label="target")
        smoothed = f", per-run EMA {EMA_BETA}" if smooth else ""
        ax.set(title=f"{title}: mean, min-max shaded{smoothed}", xlabel="step", ylabel=ylabel)
        ax.legend(fontsize=8, loc="best")
    fig.savefig(out_dir / "compare.png", dpi=100)
    (out_dir / "compare.md").write_text(_compare_markdown(rows))
    return out_dir


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m stare.report", description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", type=Path, help="run directories (each with metrics.jsonl)")
    p.add_argument("--compare", type=Path, metavar="OUT_DIR", help="write the comparison of all runs here instead")
    args = p.parse_args(argv)
    if args.compare is not None:
        print(write_comparison(args.run_dirs, args.compare))
    else:
        for run_dir in args.run_dirs:
            print(write_report(run_dir))


if __name__ == "__main__":
    main()

