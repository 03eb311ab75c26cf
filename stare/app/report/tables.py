"""The tables of docs/results.md: per label, each number's mean and 95% bootstrap interval over seeds
(`table`, descriptive), a - b paired by seed on one machine fingerprint with every statistic of a
claim (`paired`, stare.app.report.claims), and the labels that are one algorithm on this config
(`same_algorithm`)."""

from __future__ import annotations

from typing import Any

from stare.app.report.claims import pair_tables, pairs_family
from stare.app.report.stats import bootstrap_ci

LAST_STEPS = 50  # entropy_last: the mean batch entropy of a run's last steps
TIMING_KEYS = ("step_s", "load")  # what may differ between two runs of one algorithm: the machine's load
SAME_ALGORITHM_REASONS = {  # (label, label) -> why their records agree, checked against the records by same_algorithm
    ("kl-cov", "grpo"): (
        "with one update per batch the update is on-policy, the ratio r is 1 at every token and KL-Cov's "
        "penalty kl_coef |log r| has zero gradient there, so KL-Cov is GRPO; it acts only with several "
        "updates per batch (section 'Several updates per batch')"
    ),
    ("dapo", "grpo-ds"): (
        "the tiny config already has DAPO's clip-higher (0.2/0.28) and token-mean aggregation, so dynamic "
        "sampling is all DAPO adds to GRPO here, which is what grpo-ds is"
    ),
}


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


def table(
    data: dict[str, dict[int, dict[str, Any]]], columns=COLUMNS, same_as: dict[str, str] | None = None
) -> list[str]:
    """One row per label; `same_as` marks a label as another's algorithm (`kl-cov (= grpo)`)."""
    lines = ["| run | seeds | " + " | ".join(h for _, h, _, _ in columns) + " |", "|---|---|" + "---|" * len(columns)]
    for label, seeds in data.items():
        cells = [fmt(interval([n.get(key) for n in seeds.values()]), d, sc) for key, _, d, sc in columns]
        name = f"{label} (= {same_as[label]})" if same_as and label in same_as else label
        lines.append(f"| {name} | {len(seeds)} ({','.join(map(str, sorted(seeds)))}) | " + " | ".join(cells) + " |")
    return lines


def paired(data, a: str, b: str, keys: list[str], scales: dict[str, float] | None = None) -> list[str]:
    """a - b per seed both completed on the same machine fingerprint (a pair from two builds would add
    the builds' difference to the algorithms'), its keys one Holm family: claims.pair_tables."""
    return pair_tables(pairs_family(data, [(a, b, keys)], scales))


def _numbers(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("name", "label", *TIMING_KEYS)}


def same_algorithm(data: dict[str, dict[int, dict[str, Any]]]) -> dict[str, str]:
    """label -> the label it equals, for each pair of SAME_ALGORITHM_REASONS whose records agree seed by
    seed (the same seeds, every number but wall time and load equal)."""
    out = {}
    for x, y in SAME_ALGORITHM_REASONS:
        a, b = data.get(x), data.get(y)
        if a and b and set(a) == set(b) and all(_numbers(a[s]) == _numbers(b[s]) for s in a):
            out[x] = y
    return out


def same_algorithm_note(data: dict[str, dict[int, dict[str, Any]]], algorithms: tuple[str, ...]) -> str:
    """The sentence under the table: which labels are one algorithm here, and why."""
    same = same_algorithm(data)
    if not same:
        return ""
    present = [x for x in algorithms if x in data]
    reasons = "; ".join(f"`{x}` = `{y}`: {SAME_ALGORITHM_REASONS[(x, y)]}" for x, y in same.items())
    return (
        f"Of the {len(present)} algorithms above ({', '.join(present)}), {len(present) - len(same)} are distinct "
        f"at one optimizer update per batch on this config: the records of "
        + " and ".join(f"`{x}` and `{y}`" for x, y in same.items())
        + f" agree seed by seed in every number but wall time. Why: {reasons}."
    )
