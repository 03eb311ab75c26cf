"""Several runs side by side: `compare` (one row per algorithm: mean, sample std and 95% bootstrap
interval over seeds; pass@k from each run's final evaluation) and `write_comparison` (compare.png,
compare.md)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from stare.app.report.plots import _no_data, save_figure
from stare.app.report.stats import bootstrap_ci, pass_at_k_curve
from stare.app.report.summary import (
    EMA_BETA,
    EVAL_FILE,
    FINAL_FRACTION,
    METRICS_FILE,
    _fmt_duration,
    _series,
    ema,
    load_jsonl,
    summarize,
)
from stare.observe.files import write_atomic

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
    """algo -> (run dir, summary) of its runs (seeds of one algorithm), algos in order of first
    appearance; a run without `algo` is grouped under "unknown". Runs of one algo whose names differ
    beyond their seed (`s3-stare-w3` and `s3-stare`, `x-stare-s0` and `y-stare-s0`: different settings)
    are grouped by that name instead."""
    runs = [(d, summarize(d)) for d in map(Path, run_dirs)]
    stems: dict[str, set[str]] = {}
    for d, s in runs:
        stems.setdefault(s["algo"] or "unknown", set()).add(_stem(d.name))
    groups: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    for d, s in runs:
        algo = s["algo"] or "unknown"
        groups.setdefault(algo if len(stems[algo]) == 1 else _stem(d.name), []).append((d, s))
    return groups


def _stem(name: str) -> str:
    """A run's name without its seed (`s0-grpo` and `cmp-grpo-s0` -> their setting's name)."""
    return re.sub(r"^s\d+[-_]|[-_]s\d+$", "", name) or name


COMPARE_KS = (1, 8, 64)


def final_correct_counts(run_dir: Path) -> list | None:
    """[n, c] per held-out problem from the run's last evaluation, None when it has none."""
    evals = load_jsonl(Path(run_dir) / EVAL_FILE)
    return evals[-1].get("correct_counts") if evals else None


def compare(run_dirs: list[Path], ks: tuple[int, ...] = COMPARE_KS) -> list[dict[str, Any]]:
    """One row per algo: seeds (number of runs), runs (their names), final entropy and final
    held-out greedy accuracy as mean and sample std across seeds, mean in-band fraction and mean
    wall time. Each statistic is over the runs that have the number; None when none has it."""
    return _compare_rows(_group_by_algo(run_dirs), ks)


def _compare_rows(
    groups: dict[str, list[tuple[Path, dict[str, Any]]]], ks: tuple[int, ...] = COMPARE_KS
) -> list[dict[str, Any]]:
    rows = []
    for algo, runs in groups.items():
        summaries = [s for _, s in runs]

        def have(key: str) -> list[float]:
            return [s[key] for s in summaries if s[key] is not None]

        h_mean, h_std = _mean_std(have("entropy_final"))
        acc_mean, acc_std = _mean_std(have("greedy_accuracy_last"))
        curves = [pass_at_k_curve(c, ks) for d, _ in runs if (c := final_correct_counts(d))]
        pass_ci = {k: bootstrap_ci([c[i] for c in curves if c[i] is not None]) for i, k in enumerate(ks)}
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
            "entropy_final_ci": bootstrap_ci(have("entropy_final")),
            "greedy_accuracy_final_ci": bootstrap_ci(have("greedy_accuracy_last")),
            "in_band_fraction_ci": bootstrap_ci(have("in_band_fraction")),
            "pass_at_k_ci": pass_ci,
        })  # fmt: skip
    return rows


def _ci(ci: tuple[float, float, float] | None, scale: float = 1.0, digits: int = 4) -> str:
    if ci is None:
        return "n/a"
    m, lo, hi = (scale * x for x in ci)
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _compare_markdown(rows: list[dict[str, Any]], ks: tuple[int, ...] = COMPARE_KS) -> str:
    pass_ks = " | ".join(f"pass@{k}" for k in ks)
    lines = [
        "# Comparison", "", "![compare](compare.png)", "",
        f"| algo | seeds | final entropy (nats) | final held-out greedy acc. | in-band % | {pass_ks} | wall time |",
        "|---|---|---|---|---|" + "---|" * len(ks) + "---|",
    ]  # fmt: skip
    for r in rows:
        passes = " | ".join(_ci(r["pass_at_k_ci"][k]) for k in ks)
        lines.append(
            f"| {r['algo']} | {r['seeds']} | {_ci(r['entropy_final_ci'])} "
            f"| {_ci(r['greedy_accuracy_final_ci'])} "
            f"| {_ci(r['in_band_fraction_ci'], 100.0, 1)} | {passes} | {_fmt_duration(r['wall_time_s_mean'])} |"
        )
    lines += [
        "",
        "Mean [95% percentile-bootstrap interval] across seeds (10,000 resamples, numpy seed 0; "
        f"stare.app.report.stats). Final entropy: mean over the last {FINAL_FRACTION:.0%} of "
        "steps of each run. In band: the share of steps inside the entropy band from the first one inside it (0 for a "
        "run that never entered it). Final held-out accuracy: last evaluation of each run. pass@k: unbiased estimator "
        "(Chen et al. 2021) from the last evaluation's samples per problem (`task.final_eval_k`; n/a for k "
        "above them). Wall time: mean across seeds. Runs per algo: "
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


def write_comparison(run_dirs: list[Path], out_dir: Path, ks: tuple[int, ...] = COMPARE_KS) -> Path:
    """Write `out_dir/compare.png` (entropy, reward, held-out greedy accuracy side by side; per
    algo the mean across seeds with the min-max range shaded) and `out_dir/compare.md` (the table
    of `compare`); return `out_dir`. Entropy and reward are EMA-smoothed per run before averaging;
    held-out accuracy is plotted raw."""
    from matplotlib.figure import Figure  # rendered by Agg on savefig; no pyplot state

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    groups = _group_by_algo(run_dirs)
    rows = _compare_rows(groups, ks)
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
    save_figure(fig, out_dir / "compare.png", dpi=100)
    write_atomic(out_dir / "compare.md", _compare_markdown(rows, ks))
    return out_dir
