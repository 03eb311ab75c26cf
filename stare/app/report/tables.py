"""The tables of docs/results.md: per label, each number's mean and 95% bootstrap interval over seeds
(`table`), and a - b paired by seed on one machine fingerprint (`paired`)."""

from __future__ import annotations

from typing import Any

from stare.app.report import horizon
from stare.app.report.stats import bootstrap_ci

LAST_STEPS = 50  # entropy_last: the mean batch entropy of a run's last steps


def interval(values: list[float | None]) -> tuple[float, float, float] | None:
    return bootstrap_ci([v for v in values if v is not None])


def fmt(ci: tuple[float, float, float] | None, digits: int = 3, scale: float = 1.0) -> str:
    if ci is None:
        return "n/a"
    m, lo, hi = (scale * x for x in ci)
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


COLUMNS = (  # key, header, digits, scale
    ("entropy_last", f"entropy, last {LAST_STEPS} steps (nats)", 3, 1.0),
    ("in_band", "in band % (from first entry)", 1, 100.0),
    ("greedy_first", "greedy acc. at start", 3, 1.0),
    ("greedy_last", "greedy acc. at end", 3, 1.0),
    ("pass@1", "pass@1", 3, 1.0),
    ("pass@8", "pass@8", 3, 1.0),
    ("pass@64", "pass@64", 3, 1.0),
    ("step_s", "wall time / step (s)", 2, 1.0),
)


def table(data: dict[str, dict[int, dict[str, Any]]], columns=COLUMNS) -> list[str]:
    lines = ["| run | seeds | " + " | ".join(h for _, h, _, _ in columns) + " |", "|---|---|" + "---|" * len(columns)]
    for label, seeds in data.items():
        cells = [fmt(interval([n.get(key) for n in seeds.values()]), d, sc) for key, _, d, sc in columns]
        lines.append(f"| {label} | {len(seeds)} ({','.join(map(str, sorted(seeds)))}) | " + " | ".join(cells) + " |")
    return lines


def paired(data, a: str, b: str, keys: list[str], scales: dict[str, float] | None = None) -> list[str]:
    """a - b per seed both completed on the same machine fingerprint, mean [95% bootstrap] of the
    differences (a pair from two builds would add the builds' difference to the algorithms')."""
    both = sorted(set(data.get(a, {})) & set(data.get(b, {})))
    seeds = horizon.same_machine_seeds(data.get(a, {}), data.get(b, {}))
    if not seeds:
        return [f"({a} and {b} share no completed seed on one machine fingerprint yet)"]
    apart = (
        f"; seeds {', '.join(map(str, sorted(set(both) - set(seeds))))} left out: run on different machines"
        if len(seeds) < len(both)
        else ""
    )
    lines = [f"| {a} - {b}, paired by seed ({len(seeds)} seeds{apart}) | difference |", "|---|---|"]
    for key in keys:
        diffs = [
            data[a][s][key] - data[b][s][key]
            for s in seeds
            if data[a][s].get(key) is not None and data[b][s].get(key) is not None
        ]
        scale = (scales or {}).get(key, 1.0)
        name = key if scale == 1.0 else f"{key} (x {scale:g})"
        lines.append(f"| {name} | {fmt(bootstrap_ci(diffs), scale=scale)} |")
    return lines
