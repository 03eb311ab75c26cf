"""Paired comparisons of docs/results.md, in families, with the strength each deserves.

A `Comparison` is one difference a - b of one number over seeds (paired by seed, the two runs of a
seed on one machine fingerprint), with every statistic of stare.app.report.stats. A study's
comparisons form one family (`family`): Holm's adjustment runs over all of them, of the t-test's
p-values and of the exact sign-flip p-values alike. `VERDICTS` turns the numbers into the words the
README and the notes use. `pair_tables` renders a family, `seeds_sentence` says what its number of
seeds can and cannot show, `step_cell` is one pointwise cell of a per-step table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from stare.app.report.horizon import points, same_machine_seeds
from stare.app.report.stats import MAX_SEEDS, PairedDiff, bootstrap_coverage, holm, paired_diff

ALPHA = 0.05
VERDICTS = (  # (word, rule), strongest first: the first rule a comparison meets is its verdict
    ("holds", "Holm-adjusted exact sign-flip p < 0.05 (no assumption about the differences' distribution)"),
    ("holds (t-test)", "Holm-adjusted paired t-test p < 0.05 only: holds if the seed differences are normal"),
    ("suggestive", "p < 0.05 before the adjustment (t-test or sign-flip), not after it"),
    ("not resolved", "neither"),
)
Data = dict[str, dict[int, dict[str, Any]]]


@dataclass(frozen=True)
class Comparison:
    """a - b of `key` (x `scale` when shown) over `seeds`; Holm's p-values once in a family."""

    a: str
    b: str
    key: str
    seeds: tuple[int, ...]
    left_out: tuple[int, ...]  # seeds both completed, on two machine fingerprints: not paired
    stats: PairedDiff | None
    scale: float = 1.0
    holm_t: float | None = None
    holm_sign: float | None = None

    @property
    def verdict(self) -> str:
        s = self.stats
        if s is None:
            return "no pair yet"
        if s.n < 2:
            return "one seed: not resolved"
        if self.holm_sign is not None and self.holm_sign < ALPHA:
            return VERDICTS[0][0]
        if self.holm_t is not None and self.holm_t < ALPHA:
            return VERDICTS[1][0]
        if (s.p_t is not None and s.p_t < ALPHA) or s.p_sign < ALPHA:
            return VERDICTS[2][0]
        return VERDICTS[3][0]


def compare(data: Data, a: str, b: str, key: str, scale: float = 1.0) -> Comparison:
    """a - b of `key` per seed both completed on one machine fingerprint."""
    ra, rb = data.get(a, {}), data.get(b, {})
    seeds = same_machine_seeds(ra, rb)
    diffs = [ra[s][key] - rb[s][key] for s in seeds if ra[s].get(key) is not None and rb[s].get(key) is not None]
    left_out = tuple(sorted(set(ra) & set(rb) - set(seeds)))
    return Comparison(a, b, key, tuple(seeds), left_out, paired_diff(diffs), scale)


def of_diffs(a: str, b: str, key: str, diffs: dict[int, float], scale: float = 1.0) -> Comparison:
    """A comparison of differences computed elsewhere (a run's end against its own start)."""
    return Comparison(a, b, key, tuple(sorted(diffs)), (), paired_diff([diffs[s] for s in sorted(diffs)]), scale)


def family(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """The comparisons with Holm's adjustment over those that have a p-value (of each test)."""
    out = list(comparisons)
    t = [i for i, c in enumerate(out) if c.stats is not None and c.stats.p_t is not None]
    for i, p in zip(t, holm([out[i].stats.p_t for i in t])):  # type: ignore[union-attr,misc]
        out[i] = replace(out[i], holm_t=p)
    sign = [i for i, c in enumerate(out) if c.stats is not None]
    for i, p in zip(sign, holm([out[i].stats.p_sign for i in sign])):  # type: ignore[union-attr]
        out[i] = replace(out[i], holm_sign=p)
    return out


def pairs_family(
    data: Data, pairs: Sequence[tuple[str, str, Sequence[str]]], scales: dict[str, float] | None = None
) -> list[Comparison]:
    """One family of every (a, b, keys) listed: a - b of each key."""
    return family([compare(data, a, b, k, (scales or {}).get(k, 1.0)) for a, b, keys in pairs for k in keys])


def seeds_text(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


def _signed(x: float, scale: float, digits: int = 3) -> str:
    return f"{scale * x:+.{digits}f}"


def p_text(p: float | None) -> str:
    return "n/a" if p is None else ("<0.0001" if p < 1e-4 else f"{p:.4f}")


def power_text(c: Comparison) -> str:
    """Seeds for 80% power: `n/a` without a spread, `no difference` at a zero mean."""
    s = c.stats
    if s is None or s.n < 2:
        return "n/a"
    if s.mean == 0.0:
        return "no difference"
    return f"{s.seeds_80}" if s.seeds_80 is not None else f"> {MAX_SEEDS}"


def interval_text(c: Comparison) -> str:
    """`mean [t-interval]` as the prose quotes it."""
    s = c.stats
    if s is None:
        return "n/a"
    if s.t_ci is None:
        return f"{_signed(s.mean, c.scale)} (one seed)"
    return f"{_signed(s.mean, c.scale)} [{_signed(s.t_ci[0], c.scale)}, {_signed(s.t_ci[1], c.scale)}]"


TABLE_HEAD = (
    "mean | 95% t-interval | p, t-test | p, sign-flip (exact) | Holm p: t / sign-flip | 95% bootstrap | "
    "seeds for 80% power | verdict |"
)


def pair_tables(comparisons: Sequence[Comparison]) -> list[str]:
    """One table per (a, b) in order of appearance: a row per key with every statistic."""
    lines: list[str] = []
    groups: dict[tuple[str, str], list[Comparison]] = {}
    for c in comparisons:
        groups.setdefault((c.a, c.b), []).append(c)
    for (a, b), rows in groups.items():
        seeds, left_out = rows[0].seeds, rows[0].left_out
        if lines:
            lines.append("")
        if not seeds:
            lines.append(f"({a} and {b} share no completed seed on one machine fingerprint yet)")
            continue
        apart = f"; seeds {', '.join(map(str, left_out))} left out: run on different machines" if left_out else ""
        lines += [f"| {a} - {b} ({seeds_text(len(seeds))}{apart}) | {TABLE_HEAD}", "|---" * 9 + "|"]
        for c in rows:
            name = c.key if c.scale == 1.0 else f"{c.key} (x {c.scale:g})"
            s = c.stats
            if s is None:
                lines.append(f"| {name} | n/a |" + " |" * 7)
                continue
            if s.n != len(seeds):
                name += f" ({s.n} seeds)"
            t_ci = "n/a" if s.t_ci is None else f"[{_signed(s.t_ci[0], c.scale)}, {_signed(s.t_ci[1], c.scale)}]"
            lines.append(
                f"| {name} | {_signed(s.mean, c.scale)} | {t_ci} | {p_text(s.p_t)} | {p_text(s.p_sign)} | "
                f"{p_text(c.holm_t)} / {p_text(c.holm_sign)} | [{_signed(s.boot[0], c.scale)}, {_signed(s.boot[1], c.scale)}] | "
                f"{power_text(c)} | {c.verdict} |"
            )
    return lines


def seeds_sentence(comparisons: Sequence[Comparison]) -> str:
    """What the section's number of seeds can and cannot show, and its family."""
    ns = sorted({c.stats.n for c in comparisons if c.stats is not None})
    m = sum(1 for c in comparisons if c.stats is not None)
    if not ns:
        return "No pair of runs has completed on one machine fingerprint yet: nothing to compare."
    n = ns[-1]
    count = f"{ns[0]}-{n}" if len(ns) > 1 else f"{n}"
    if n < 2:
        return (
            f"{count} seed per pair: one difference per comparison, no spread to estimate, so no interval "
            "beyond the point and no test (the rows say `one seed`); read them as the first run of a set."
        )
    floor = 2.0 / 2**n
    reach = (
        f"even the strongest of the section's {m} comparisons, with every seed agreeing in sign, gets a "
        f"Holm-adjusted sign-flip p of {min(1.0, m * floor):.4f}"
        if m * floor >= ALPHA
        else f"a comparison holds without any assumption about the differences' distribution only if nearly "
        f"every seed agrees in sign (the smallest Holm-adjusted sign-flip p over the {m} comparisons is "
        f"{m * floor:.4f})"
    )
    verdict = (
        ", so nothing here can hold without the t-test's assumption of normal differences" if m * floor >= ALPHA else ""
    )
    return (
        f"{count} seeds per pair (each seed's two runs on one machine fingerprint). With {n} seeds the exact "
        f"sign-flip test cannot go below p = 2/2^{n} = {floor:.4f}, and {reach}{verdict}. Holm's adjustment runs "
        f"over the {m} comparisons of this section (its family). A 95% percentile bootstrap over {n} seeds "
        f"covers about {100 * bootstrap_coverage(n):.0f}% on normal data, which is why the t-interval stands "
        "beside it. What these seeds can show: differences several times their seed-to-seed spread; what they "
        "cannot: differences of the order of that spread (the power column: the seeds each difference needs)."
    )


def step_cell(diffs: Sequence[float], scale: float = 1.0) -> str:
    """One pointwise per-step cell: mean [95% t-interval], `*` where the interval excludes 0."""
    s = paired_diff(list(diffs), power=False)
    if s is None:
        return "n/a"
    if s.t_ci is None:
        return _signed(s.mean, scale)  # one seed: no interval
    lo, hi = s.t_ci
    mark = " *" if lo > 0 or hi < 0 else ""
    return f"{_signed(s.mean, scale)} [{_signed(lo, scale)}, {_signed(hi, scale)}]{mark}"


def step_diffs(data: Data, a: str, b: str, key: str) -> dict[int, list[float]]:
    """step -> a - b per seed (both on one machine fingerprint) at the evaluation steps both reached."""
    out: dict[int, list[float]] = {}
    for s in same_machine_seeds(data.get(a, {}), data.get(b, {})):
        pa, pb = points(data[a][s], key), points(data[b][s], key)
        for step in sorted(set(pa) & set(pb)):
            out.setdefault(step, []).append(pa[step] - pb[step])
    return out


def find(comparisons: Sequence[Comparison], a: str, b: str, key: str) -> Comparison | None:
    return next((c for c in comparisons if (c.a, c.b, c.key) == (a, b, key)), None)
