"""Held-out accuracy against step, over seeds: the curves of docs/results.md's studies.

Each run evaluates every `task.eval_every` steps with n samples per problem (scripts/results.sh,
SETS of the study). `eval_curve` turns a run's eval.jsonl into its curve (one point per evaluation:
greedy accuracy and unbiased pass@k from `correct_counts`), kept in the run's record. Over seeds:
`bands` (mean and 95% bootstrap interval per evaluation step); `same_machine_seeds` (the seeds two
labels may be paired on: both runs on one machine fingerprint); `finish_figure` (the studies'
figures' common end).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stare.app.report.stats import bootstrap_ci, pass_at_k_curve

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


def points(record: dict[str, Any], key: str) -> dict[int, float]:
    """step -> `key` of a record's evaluation curve, where it has one."""
    return {p["step"]: p[key] for p in record.get("eval_curve") or [] if p.get(key) is not None}


def bands(seeds: dict[int, dict[str, Any]], key: str) -> list[Band]:
    """Per evaluation step every seed reached: the mean over seeds of `key` and its 95% interval."""
    curves = [points(r, key) for r in seeds.values()]
    steps = sorted(set.intersection(*(set(p) for p in curves))) if curves else []
    return [(s, *bootstrap_ci([p[s] for p in curves])) for s in steps]


def same_machine_seeds(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]]) -> list[int]:
    return sorted(s for s in set(a) & set(b) if a[s].get("machine") == b[s].get("machine"))


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
