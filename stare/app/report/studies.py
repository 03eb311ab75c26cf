"""Curves of the two smaller studies of docs/results.md: several updates per batch (the baselines'
mini-batches, `docs/results/mb/`) and the real model (SmolLM2-135M-Instruct, `docs/results/smollm2/`).

From the run records (stare.app.report.results): `entropy_bands` (batch entropy per step, mean and
95% bootstrap interval over seeds, optionally smoothed), `entropy_table` (a, b and a - b paired by
seed at chosen steps, same machine fingerprint only, t-intervals) and the two figures. The bands cover the steps
every seed reached; a record without an entropy curve is left out of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stare.app.report.claims import seeds_text, step_cell
from stare.app.report.horizon import Band, bands, finish_figure, same_machine_seeds
from stare.app.report.stats import bootstrap_ci


def _entropy(record: dict[str, Any], window: int) -> dict[int, float]:
    """step -> batch entropy, as a trailing mean over `window` steps from the window's last step on."""
    steps, values = record.get("entropy_curve") or ([], [])
    out = {}
    for i in range(window - 1, len(values)):
        out[int(steps[i])] = sum(values[i - window + 1 : i + 1]) / window
    return out


def entropy_bands(seeds: dict[int, dict[str, Any]], *, window: int = 1, every: int = 1) -> list[Band]:
    """Per step every seed reached (each `every`-th): mean over seeds of the `window`-step mean
    entropy, and its 95% interval."""
    curves = [_entropy(r, window) for r in seeds.values()]
    if not curves:
        return []
    steps = sorted(set.intersection(*(set(c) for c in curves)))[::every]
    return [(s, *bootstrap_ci([c[s] for c in curves])) for s in steps]


def entropy_table(
    data: dict[str, dict[int, dict[str, Any]]], a: str, b: str, steps: Sequence[int], window: int = 1
) -> list[str]:
    """Batch entropy at `steps` (a `window`-step mean ending there): a, b (mean [95% bootstrap]), and
    a - b paired by seed (mean [95% t-interval], `*` where it excludes 0: claims.step_cell)."""
    if a not in data or b not in data:
        return [f"({a} and {b} both need completed runs for the entropy table)"]
    ca, cb = ({r[0]: r for r in entropy_bands(data[x], window=window)} for x in (a, b))
    seeds = same_machine_seeds(data[a], data[b])
    pairs = [(_entropy(data[a][s], window), _entropy(data[b][s], window)) for s in seeds]
    cell = lambda r: "n/a" if r is None else f"{r[1]:.3f} [{r[2]:.3f}, {r[3]:.3f}]"  # noqa: E731
    head = "batch entropy" if window == 1 else f"batch entropy, {window}-step mean"
    lines = [
        f"| step | {a} {head} | {b} {head} | {a} - {b}, paired ({seeds_text(len(seeds))}, 95% t) |",
        "|---|---|---|---|",
    ]
    for step in steps:
        diffs = [x[step] - y[step] for x, y in pairs if step in x and step in y]
        lines.append(f"| {step} | {cell(ca.get(step))} | {cell(cb.get(step))} | {step_cell(diffs)} |")
    return lines


def _plot_bands(ax, rows: list[Band], label: str, marker: str | None = None) -> None:
    import numpy as np

    if not rows:
        return
    x, m, lo, hi = (np.array(c) for c in zip(*rows))
    ax.plot(x, m, label=label, marker=marker, markersize=3)
    ax.fill_between(x, lo, hi, alpha=0.15)


def minibatch_figure(data: dict[str, dict[int, dict[str, Any]]], path: Path, labels: Sequence[str]) -> None:
    """Batch entropy (10-step mean) and held-out avg@n per evaluation, one update per batch against
    several: mean and 95% band over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for label in labels:
        if data.get(label):
            name = f"{label} ({len(data[label])} seeds)"
            _plot_bands(axes[0], entropy_bands(data[label], window=10, every=5), name)
            _plot_bands(axes[1], bands(data[label], "pass@1"), name, marker="o")
    finish_figure(
        fig,
        axes,
        ("batch entropy (nats), 10-step mean", "held-out avg@n (pass@1) per evaluation"),
        "One update per batch (grpo) and the baselines' mini-batches: mean and 95% bootstrap band",
        path,
        legend_size=8,
    )


def smollm2_figure(data: dict[str, dict[int, dict[str, Any]]], path: Path, labels: Sequence[str]) -> None:
    """SmolLM2: batch entropy per step, held-out greedy accuracy and avg@n per evaluation; mean and
    95% band over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for label in labels:
        seeds = data.get(label)
        if not seeds:
            continue
        name = f"{label} ({len(seeds)} seeds)"
        _plot_bands(axes[0], entropy_bands(seeds), name, marker="o")
        _plot_bands(axes[1], bands(seeds, "greedy"), name, marker="o")
        _plot_bands(axes[2], bands(seeds, "pass@1"), name, marker="o")
    finish_figure(
        fig,
        axes,
        ("batch entropy (nats) per step", "held-out greedy accuracy", "held-out avg@n (pass@1)"),
        "SmolLM2-135M-Instruct on chat-arithmetic: mean over seeds and 95% bootstrap band",
        path,
    )
