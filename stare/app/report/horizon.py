"""The longer-horizon study of docs/results.md: held-out accuracy against step, over seeds.

Each run of the study evaluates every `task.eval_every` steps with n samples per problem
(scripts/results.sh, SETS of the study). `eval_curve` turns a run's eval.jsonl into its curve (one
point per evaluation: greedy accuracy and unbiased pass@k from `correct_counts`), kept in the run's
record. Over seeds: `bands` (mean and 95% bootstrap interval per evaluation step), `paired_curve`
(a - b paired by seed, same machine fingerprint only) and `crossing` (where the paired difference
turns and stays non-negative, and where its interval first lies above zero).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stare.app.report.stats import bootstrap_ci, pass_at_k_curve

HORIZON_RECORDS = Path("docs/results/long")
CURVE_KS = (1, 8, 64)
Band = tuple[int, float, float, float]  # step, mean, low, high


def eval_curve(evals: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per evaluation that kept its per-problem counts: step, greedy, pass@k (None for a k
    above the samples it drew)."""
    out = []
    for e in evals:
        if not e.get("correct_counts"):
            continue
        curve = pass_at_k_curve(e["correct_counts"], CURVE_KS)
        out.append(
            {
                "step": int(e["step"]),
                "greedy": e.get("greedy_accuracy"),
                **{f"pass@{k}": None if v is None else round(v, 6) for k, v in zip(CURVE_KS, curve)},
            }
        )
    return out


def _points(record: dict[str, Any], key: str) -> dict[int, float]:
    return {p["step"]: p[key] for p in record.get("eval_curve") or [] if p.get(key) is not None}


def bands(seeds: dict[int, dict[str, Any]], key: str) -> list[Band]:
    """Per evaluation step every seed reached: the mean over seeds of `key` and its 95% interval."""
    points = [_points(r, key) for r in seeds.values()]
    steps = sorted(set.intersection(*(set(p) for p in points))) if points else []
    return [(s, *bootstrap_ci([p[s] for p in points])) for s in steps]


def same_machine_seeds(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]]) -> list[int]:
    return sorted(s for s in set(a) & set(b) if a[s].get("machine") == b[s].get("machine"))


def paired_curve(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]], key: str) -> list[Band]:
    """a - b per evaluation step, paired by seed (seeds of both on one machine fingerprint)."""
    pairs = [(_points(a[s], key), _points(b[s], key)) for s in same_machine_seeds(a, b)]
    if not pairs:
        return []
    steps = sorted(set.intersection(*(set(x) & set(y) for x, y in pairs)))
    return [(s, *bootstrap_ci([x[s] - y[s] for x, y in pairs])) for s in steps]


def crossing(diffs: list[Band]) -> dict[str, int | None]:
    """`means`: the first step from which the mean difference stays >= 0 to the last evaluation
    (None if the last is negative); `separated`: the first step whose interval lies above zero."""
    means = None
    for step, mean, _, _ in diffs:
        if mean < 0:
            means = None
        elif means is None:
            means = step
    separated = next((step for step, _, low, _ in diffs if low > 0), None)
    return {"means": means, "separated": separated}


def figure(data: dict[str, dict[int, dict[str, Any]]], path: Path, labels: Sequence[str]) -> None:
    """held-out pass@1 and pass@64 against step, and batch entropy: mean and 95% band over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for label in labels:
        seeds = data.get(label)
        if not seeds:
            continue
        for ax, key in zip(axes[:2], ("pass@1", "pass@64")):
            rows = bands(seeds, key)
            if rows:
                x, m, lo, hi = (np.array(c) for c in zip(*rows))
                ax.plot(x, m, marker="o", markersize=3, label=f"{label} ({len(seeds)} seeds)")
                ax.fill_between(x, lo, hi, alpha=0.15)
        curves = [r["entropy_curve"][1] for r in seeds.values()]
        length = min(len(c) for c in curves)
        window = max(1, min(25, length))
        smooth = np.array([np.convolve(c[:length], np.ones(window) / window, mode="valid") for c in curves])
        x = np.arange(window, length + 1)
        ci = [bootstrap_ci(col) for col in smooth.T[::5]]  # every 5th step: the band, not a per-step loop cost
        axes[2].plot(x[::5], [c[0] for c in ci], label=label)
        axes[2].fill_between(x[::5], [c[1] for c in ci], [c[2] for c in ci], alpha=0.15)
    finish_figure(
        fig,
        axes,
        ("held-out pass@1 (avg@n)", "held-out pass@64", "batch entropy (nats), 25-step mean"),
        "Longer horizon: mean over seeds and 95% bootstrap band",
        path,
    )


def finish_figure(fig, axes, titles, suptitle: str, path: Path, legend_size: int = 7) -> None:
    """Each panel's x label, title and legend (where it has lines), the figure's title, saved to path."""
    import matplotlib.pyplot as plt

    for ax, title in zip(axes, titles):
        ax.set_xlabel("step")
        ax.set_title(title, fontsize=10)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=legend_size)
    fig.suptitle(suptitle, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _cell(band: Band | None) -> str:
    return "n/a" if band is None else f"{band[1]:.3f} [{band[2]:.3f}, {band[3]:.3f}]"


def curve_table(data: dict[str, dict[int, dict[str, Any]]], a: str, b: str, key: str) -> list[str]:
    """Per evaluation step: a, b (mean [95%]) and a - b paired by seed."""
    if a not in data or b not in data:
        return [f"({a} and {b} both need completed runs for the {key} curve)"]
    ra, rb = {r[0]: r for r in bands(data[a], key)}, {r[0]: r for r in bands(data[b], key)}
    diff = {r[0]: r for r in paired_curve(data[a], data[b], key)}
    lines = [f"| step | {a} {key} | {b} {key} | {a} - {b}, paired |", "|---|---|---|---|"]
    for step in sorted(set(ra) | set(rb)):
        lines.append(f"| {step} | {_cell(ra.get(step))} | {_cell(rb.get(step))} | {_cell(diff.get(step))} |")
    return lines
