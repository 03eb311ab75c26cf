"""The longer-horizon study of docs/results.md: 1,500 steps, the second protocol (docs/results/long2/)
and the first one (docs/results/long/), kept as history.

Second protocol (scripts/results.sh's header): STARE as the tiny config tunes it, STARE at the paper's
settings (`stare-paper`), GRPO and DAPO, all on one machine fingerprint, held-out evaluation every 100
steps with 64 samples per problem and a final one with 128, 10 seeds planned per label. The sections
render from whatever records exist (a sweep still running gives fewer seeds, said in the text) and
pair only seeds whose two runs share a machine fingerprint.

`final_family`: the four pairs' final numbers, one Holm family. `coverage_family`: each label's end
against its own start (same seed, same held-out problems, same model at step 0), one family.
`step_table`: a - b per evaluation step, pointwise 95% t-intervals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stare.app.report.claims import (
    Comparison,
    family,
    find,
    interval_text,
    of_diffs,
    pair_tables,
    pairs_family,
    seeds_sentence,
    seeds_text,
    step_cell,
    step_diffs,
)
from stare.app.report.horizon import same_machine_seeds
from stare.app.report.tables import table

LONG_RECORDS = Path("docs/results/long2")
FIRST_PROTOCOL_RECORDS = Path("docs/results/long")
LABELS = ("stare", "grpo", "dapo", "stare-paper")
PAIRS = (("stare", "grpo"), ("stare", "dapo"), ("stare-paper", "grpo"), ("stare-paper", "stare"))
FINAL_KEYS = ("entropy_last", "greedy_last", "pass@1", "pass@8", "pass@64")
STEP_KEYS = ("greedy", "pass@1", "pass@64")
PLANNED_SEEDS = 10
Data = dict[str, dict[int, dict[str, Any]]]


def final_family(data: Data) -> list[Comparison]:
    return pairs_family(data, [(a, b, FINAL_KEYS) for a, b in PAIRS])


def _curve(record: dict[str, Any]) -> list[dict[str, Any]]:
    return record.get("eval_curve") or []


def coverage_family(data: Data) -> list[Comparison]:
    """Per label and key of STEP_KEYS: the last evaluation minus the first (step 0), per seed."""
    out = []
    for label in (x for x in LABELS if x in data):
        for key in STEP_KEYS:
            diffs = {
                s: c[-1][key] - c[0][key]
                for s, r in data[label].items()
                if len(c := _curve(r)) > 1 and c[0]["step"] == 0 and c[-1].get(key) is not None
            }
            out.append(of_diffs(label, "its start", key, diffs))
    return family(out)


def step_table(data: Data, a: str, b: str) -> list[str]:
    """a - b per evaluation step for greedy, pass@1 and pass@64: mean [95% t-interval], `*` where it excludes 0."""
    cols = {k: step_diffs(data, a, b, k) for k in STEP_KEYS}
    steps = sorted(set().union(*cols.values()))
    if not steps:
        return [f"({a} and {b} share no completed seed on one machine fingerprint yet)"]
    n = len(same_machine_seeds(data[a], data[b]))
    head = f"| step ({a} - {b}, {seeds_text(n)}) | " + " | ".join(STEP_KEYS) + " |"
    lines = [head, "|---" * (len(STEP_KEYS) + 1) + "|"]
    for step in steps:
        lines.append(f"| {step} | " + " | ".join(step_cell(cols[k].get(step, [])) for k in STEP_KEYS) + " |")
    return lines


def _coverage_sentence(data: Data, coverage: list[Comparison], final: list[Comparison]) -> str:
    """What the data says about ending below the starting model's pass@64, generated from it."""
    rows = [c for c in coverage if c.key == "pass@64" and c.stats is not None and c.stats.t_ci is not None]
    if not rows:
        return "With fewer than 2 seeds per label there is no interval yet for the change of pass@64 from the start."
    below = [c.a for c in rows if c.stats.t_ci[1] < 0]
    above = [c.a for c in rows if c.stats.t_ci[0] > 0]
    level = [c.a for c in rows if c.a not in below and c.a not in above]
    parts = []
    if below:
        parts.append(
            f"{', '.join(below)} end{'s' if len(below) == 1 else ''} below the starting model's pass@64 "
            "(the t-interval of end minus start lies below 0)"
        )
    if above:
        parts.append(f"{', '.join(above)} end{'s' if len(above) == 1 else ''} above it")
    if level:
        parts.append(f"for {', '.join(level)} the interval includes 0")
    text = "Coverage against the starting model: " + "; ".join(parts) + "."
    sg = find(final, "stare", "grpo", "pass@64")
    if "stare" in below and "grpo" in below and sg is not None and sg.stats is not None:
        if sg.stats.mean > 0 and sg.verdict.startswith("holds"):
            text += (
                f" STARE ends with more pass@64 than GRPO ({interval_text(sg)}, {sg.verdict}): it loses less "
                "coverage than GRPO; it adds none."
            )
        else:
            text += (
                f" STARE minus GRPO at the end: {interval_text(sg)} ({sg.verdict}): STARE adds no coverage, and "
                "whether it loses less than GRPO is not resolved."
            )
    return text


def _seeds_line(data: Data, planned: int | None = PLANNED_SEEDS) -> str:
    present = [f"{x} {len(data[x])} ({','.join(map(str, sorted(data[x])))})" for x in LABELS if x in data]
    others = sorted(set(data) - set(LABELS))
    return (
        f"seeds completed: {'; '.join(present) or 'none'}"
        + (f"; other labels in the folder: {', '.join(others)}" if others else "")
        + (f" (planned: {planned} of each)." if planned else ".")
    )


def _machines(data: Data) -> str:
    return ", ".join(sorted({n["machine"] for s in data.values() for n in s.values()}))


def section(data: Data, figure: str, final: list[Comparison], coverage: list[Comparison]) -> list[str]:
    """The second protocol's section: curves, the final family, coverage, per-step differences."""
    steps = sorted({n["steps"] for s in data.values() for n in s.values()})
    return [
        f"## Longer horizon ({', '.join(map(str, steps))} steps): STARE, the paper's STARE, GRPO and DAPO",
        "",
        "The tiny config trained 1,500 steps, evaluated every 100 steps with 64 samples per held-out problem "
        "(128 problems, temperature 1) and greedily, and at the end with 128 samples per problem (pass@k up to "
        "64 by the unbiased estimator); runs kept in `docs/results/long2/` (scripts/results.sh, the second "
        "protocol in its header). `stare` is the tiny config's tuned STARE (C2, top 5% by surprisal, W and M "
        "proportional to the entropy error with gain 10, W up to 10, M down to 0.1, entropy smoothed by an EMA "
        "of 0.8, target 0.24 in the band [0.17, 0.31]); `stare-paper` is the paper's (O1, top 10%, W 1.1 fixed, "
        "the gate at target 0.3 with no band, no adaptation); `dapo` is the tiny config's GRPO with dynamic "
        "sampling (it already has clip-higher and token-mean aggregation). " + "S" + _seeds_line(data)[1:],
        "",
        "This set supersedes the first protocol's (`docs/results/long/`, section below): one protocol and one "
        "machine fingerprint for all four labels, 10 seeds planned for each where the first had 5 of STARE and "
        "GRPO only, DAPO and the paper's settings beside them, and a final evaluation from 128 samples per "
        "problem instead of 64, so that the evaluation's sampling noise is smaller than the seed-to-seed spread.",
        "",
        seeds_sentence(final),
        "",
        f"![longer horizon]({figure})",
        "",
        *pair_tables(final),
        "",
        "Each label's last evaluation minus its first (step 0: the starting model on the same seed's held-out "
        "problems), one family of its own:",
        "",
        *pair_tables(coverage),
        "",
        _coverage_sentence(data, coverage, final),
        "",
        "Per evaluation step, a - b paired by seed: mean [95% t-interval], `*` where the interval excludes 0 "
        "(pointwise: over 16 steps and 3 numbers, about 2 of 48 cells would exclude 0 by chance alone if the "
        "algorithms did not differ; step 0 is the same model for both, so 0 there). The last step's pass@ "
        "numbers come from 128 samples per problem, the others' from 64.",
        "",
        *[line for a, b in PAIRS for line in (*step_table(data, a, b), "")],
        *table({x: data[x] for x in (*LABELS, *sorted(set(data) - set(LABELS))) if x in data}),
        "",
        f"Machines (model sha256 prefix / torch CPU capability): {_machines(data)}.",
        "",
    ]


def first_protocol_family(data: Data) -> list[Comparison]:
    return pairs_family(data, [("stare", "grpo", FINAL_KEYS)])


def first_protocol_section(data: Data, final: list[Comparison], coverage: list[Comparison]) -> list[str]:
    """The first protocol's records (history), with the statistics the report uses now."""
    return [
        "## Longer horizon, first protocol (history, superseded)",
        "",
        "The records in `docs/results/long/`: STARE and GRPO, 1,500 steps, evaluated every 100 steps and at the "
        f"end with 64 samples per problem; {_seeds_line(data, None)} Kept unchanged as the record of what the "
        "README once claimed from them; the second protocol above supersedes them (more seeds, DAPO and the "
        "paper's settings beside them, 128 final samples per problem, one machine for all).",
        "",
        seeds_sentence(final),
        "",
        *pair_tables(final),
        "",
        "Each label's last evaluation minus its first (step 0), one family of its own:",
        "",
        *pair_tables(coverage),
        "",
        _coverage_sentence(data, coverage, final),
        "",
        *step_table(data, "stare", "grpo"),
        "",
        f"Machines (model sha256 prefix / torch CPU capability): {_machines(data)}.",
        "",
    ]


def figure(data: Data, path: Path) -> None:
    """Top: greedy, pass@1, pass@64 per evaluation and batch entropy per label (mean, 95% bootstrap band
    over seeds). Bottom: each pair's a - b (mean, 95% t band), filled markers where the t-interval
    excludes 0, hollow where it does not."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from stare.app.report.horizon import bands, finish_figure
    from stare.app.report.stats import bootstrap_ci, t_interval

    fig, axes = plt.subplots(2, 4, figsize=(19, 8.5))
    labels = [x for x in (*LABELS, *sorted(set(data) - set(LABELS))) if data.get(x)]
    for label in labels:
        seeds = data[label]
        for ax, key in zip(axes[0][:3], STEP_KEYS):
            if rows := bands(seeds, key):
                x, m, lo, hi = (np.array(c) for c in zip(*rows))
                ax.plot(x, m, marker="o", markersize=3, label=f"{label} ({seeds_text(len(seeds))})")
                ax.fill_between(x, lo, hi, alpha=0.15)
        curves = [r["entropy_curve"][1] for r in seeds.values()]
        length = min(len(c) for c in curves)
        window = max(1, min(25, length))
        smooth = np.array([np.convolve(c[:length], np.ones(window) / window, mode="valid") for c in curves])
        xs = np.arange(window, length + 1)[::5]  # every 5th step: the band, not a per-step loop cost
        ci = [bootstrap_ci(col) for col in smooth.T[::5]]
        axes[0][3].plot(xs, [c[0] for c in ci], label=label)
        axes[0][3].fill_between(xs, [c[1] for c in ci], [c[2] for c in ci], alpha=0.15)
    for a, b in PAIRS:
        if not same_machine_seeds(data.get(a, {}), data.get(b, {})):
            continue
        for ax, key in zip(axes[1][:3], STEP_KEYS):
            rows = [(s, d) for s, d in sorted(step_diffs(data, a, b, key).items())]
            x = np.array([s for s, _ in rows])
            m = np.array([float(np.mean(d)) for _, d in rows])
            cis = [t_interval(d) for _, d in rows]
            line = ax.plot(x, m, label=f"{a} - {b}")[0]
            if all(c is not None for c in cis):
                lo, hi = np.array([c[1] for c in cis]), np.array([c[2] for c in cis])
                ax.fill_between(x, lo, hi, alpha=0.12, color=line.get_color())
                excl = (lo > 0) | (hi < 0)
                ax.scatter(x[excl], m[excl], color=line.get_color(), s=22, zorder=3)
                ax.scatter(x[~excl], m[~excl], facecolors="none", edgecolors=line.get_color(), s=22, zorder=3)
        ents = {s: data[a][s]["entropy_curve"][1] for s in same_machine_seeds(data[a], data[b])}
        entb = {s: data[b][s]["entropy_curve"][1] for s in ents}
        length = min(len(c) for c in (*ents.values(), *entb.values()))
        xs = list(range(50, length + 1, 50))  # 50-step means ending at each 50th step
        diffs = [[float(np.mean(ents[s][t - 50 : t]) - np.mean(entb[s][t - 50 : t])) for s in ents] for t in xs]
        axes[1][3].plot(xs, [np.mean(d) for d in diffs], label=f"{a} - {b}")
        if len(ents) > 1:
            cis = [t_interval(d) for d in diffs]
            axes[1][3].fill_between(xs, [c[1] for c in cis], [c[2] for c in cis], alpha=0.12)
    for ax in axes[1]:
        ax.axhline(0.0, color="black", linewidth=0.8)
    finish_figure(
        fig,
        axes.ravel(),
        (
            *[f"held-out {k} (mean, 95% bootstrap band)" for k in STEP_KEYS],
            "batch entropy (nats), 25-step mean",
            *[f"{k}: a - b paired (95% t band; filled: excludes 0)" for k in STEP_KEYS],
            "batch entropy, 50-step mean: a - b paired (95% t band)",
        ),
        "Longer horizon: per label (top) and paired differences (bottom)",
        path,
    )
