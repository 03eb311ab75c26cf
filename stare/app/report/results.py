"""docs/results.md and its figures from a sweep's run records (scripts/results.sh).

    python -m stare.app.report.results --record runs/results/s0-stare ...   a completed run -> its record
    python -m stare.app.report.results --out docs/results.md --figures docs/results   the report

Run folders are named `s<seed>-<label>` (label: an algorithm or a controller variant). A completed
run (its final evaluation present) becomes a record, `docs/results/runs/<name>.json`: its numbers,
entropy curve and machine fingerprint, a few KB kept in git, so that a sweep longer than one
sitting accumulates across sessions and machines and the report is regenerated from what is kept.
Per label, every number is the mean over its seeds and a 95% percentile-bootstrap interval
(stare.app.report.stats); pass@k comes from each run's final evaluation (n samples per held-out
problem, `correct_counts`), by the unbiased estimator. Differences are paired by seed, and only
between runs on the same machine fingerprint (model build and CPU kernels); each study's differences
are one family (stare.app.report.claims: t-interval, paired t and exact sign-flip p-values, Holm,
power, verdict), and the claims section (headline.py) collects the ones the README cites. Each
study's section renders from whatever records exist, so a sweep still running gives a report with
fewer seeds, said in the text.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from stare.app.report import long_study, studies
from stare.app.report.claims import Comparison, pair_tables, pairs_family, seeds_sentence
from stare.app.report.headline import claims_section
from stare.app.report.records import (  # noqa: F401  (re-exported: the report's callers read records through here)
    MINI_BATCH_RECORDS,
    PASS_KS,
    RECORDS_DIR,
    SMOLLM2_RECORDS,
    _mean,
    collect,
    record,
    update_numbers,
    write_record,
)
from stare.app.report.study_sections import (
    MINI_BATCH_LABELS,
    minibatch_family,
    minibatch_section,
    smollm2_family,
    smollm2_section,
)
from stare.app.report.tables import (  # noqa: F401 (re-exported)
    COLUMNS,
    LAST_STEPS,
    fmt,
    interval,
    paired,
    same_algorithm,
    same_algorithm_note,
    table,
)

ALGORITHMS = ("stare", "grpo", "grpo-ds", "dapo", "entropy-bonus", "clip-cov", "kl-cov", "80-20")  # the --algo presets
TINY_PAIRS = (
    ("stare", "grpo", ["entropy_last", "greedy_last", "pass@1", "pass@8", "pass@64"]),
    ("stare", "stare-pctl", ["w_variation", "in_band", "entropy_last", "greedy_last", "pass@64"]),
)


def figures(data, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    names = []
    fig, ax = plt.subplots(figsize=(9, 5))
    for label, seeds in data.items():
        curves = [n["entropy_curve"] for n in seeds.values()]
        length = min(len(c[1]) for c in curves)
        ys = np.array([c[1][:length] for c in curves])  # [seeds, steps]
        window = max(1, min(10, length))
        smooth = np.array([np.convolve(y, np.ones(window) / window, mode="valid") for y in ys])
        x = np.array(curves[0][0][:length])[window - 1 :]
        ax.plot(x, smooth.mean(0), label=f"{label} ({len(seeds)} seeds)")
        ax.fill_between(x, smooth.min(0), smooth.max(0), alpha=0.12)
    band = next((n["band"] for s in data.values() for n in s.values() if n["band"] and n["band"][0] is not None), None)
    if band:
        ax.axhspan(band[0], band[1], color="grey", alpha=0.15, label=f"STARE band [{band[0]}, {band[1]}]")
        ax.axhline(band[2], color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("batch entropy (nats), 10-step mean")
    ax.set_title("Entropy: mean over seeds (line), min-max over seeds (shaded)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "entropy.png", dpi=110)
    plt.close(fig)
    names.append("entropy.png")

    fig, ax = plt.subplots(figsize=(7, 5))
    for label, seeds in data.items():
        cis = [interval([n[f"pass@{k}"] for n in seeds.values()]) for k in PASS_KS]
        ks = [k for k, c in zip(PASS_KS, cis) if c is not None]
        cis = [c for c in cis if c is not None]
        if not cis:
            continue
        ax.plot(ks, [c[0] for c in cis], marker="o", markersize=3, label=label)
        ax.fill_between(ks, [c[1] for c in cis], [c[2] for c in cis], alpha=0.12)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("held-out pass@k (unbiased, n = 64)")
    ax.set_title("pass@k at the end: mean and 95% bootstrap interval over seeds")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "pass_at_k.png", dpi=110)
    plt.close(fig)
    names.append("pass_at_k.png")
    return names


def families(data, long=None, first=None, mb=None, real=None) -> dict[str, list[Comparison]]:
    """Each study's comparisons, one Holm family each (empty for a study without records)."""
    return {
        "tiny": pairs_family(data, TINY_PAIRS),
        "long": long_study.final_family(long) if long else [],
        "coverage": long_study.coverage_family(long) if long else [],
        "first": long_study.first_protocol_family(first) if first else [],
        "first-coverage": long_study.coverage_family(first) if first else [],
        "mb": minibatch_family(mb) if mb else [],
        "smollm2": smollm2_family(real) if real else [],
    }


def render(
    data,
    figure_dir: str,
    notes: str = "",
    long: dict | None = None,
    long_figure: str = "",
    mb: dict | None = None,
    mb_figure: str = "",
    real: dict | None = None,
    real_figure: str = "",
    first: dict | None = None,
) -> str:
    """docs/results.md from the studies' records: `data` the 300-step sweep, `long` the longer horizon
    (second protocol), `first` its first protocol, `mb` several updates per batch, `real` SmolLM2."""
    machines = sorted({n["machine"] for s in data.values() for n in s.values()})
    loads = [n["load"] for s in data.values() for n in s.values() if n["load"] is not None]
    fams = families(data, long, first, mb, real)
    lines = [
        "# Results on the tiny config",
        "",
        "Generated by `scripts/results.sh report` (`python -m stare.app.report.results`) from the run records "
        "kept in `docs/results/`; do not edit by hand. Per label, a number is the mean over seeds and its 95% "
        "percentile-bootstrap interval (10,000 resamples of the seeds, numpy seed 0): descriptive. Every paired "
        "difference (a - b per seed, the two runs of a seed on one machine fingerprint) carries its mean, a 95% "
        "Student t-interval, the paired t-test's and the exact sign-flip test's two-sided p-values (all 2^n sign "
        "assignments), both Holm-adjusted within the section's family of comparisons, the bootstrap interval "
        "beside them, the seeds a paired t-test would need for 80% power at the observed size, and a verdict "
        "(the rules are in the next section). Per-step tables give pointwise t-intervals, marked `*` where the "
        "interval excludes 0.",
        "",
        *claims_section(fams),
        f"![entropy]({figure_dir}/entropy.png)",
        "",
        f"![pass@k]({figure_dir}/pass_at_k.png)",
        "",
        "## All runs",
        "",
        *table(data, same_as=same_algorithm(data)),
        "",
        f"Entropy: mean batch entropy over the last {LAST_STEPS} steps. In band: from the first step inside "
        "the band, the share of steps inside it (GRPO and the baselines are measured against STARE's band, "
        "logged for every algorithm). Greedy accuracy at start / end: the first and final held-out evaluation "
        "(128 problems). pass@k: unbiased estimator (Chen et al. 2021) from the final evaluation's 64 samples "
        "per problem at temperature 1; pass@1 is avg@64. Wall time: mean `time_step_s` (sampling, scoring, "
        "learning) on a shared 2-core machine.",
        "",
        *([note, ""] if (note := same_algorithm_note(data, ALGORITHMS)) else []),
        "## The controller",
        "",
        *table(
            data,
            (
                ("w_variation", "mean step-to-step change of W", 3, 1.0),
                ("w_mean", "mean W", 2, 1.0),
                ("gate_on", "gate on %", 1, 100.0),
                ("in_band", "in band %", 1, 100.0),
                ("in_band_last", f"in band %, last {LAST_STEPS}", 1, 100.0),
                ("entropy_last", "entropy, last 50", 3, 1.0),
            ),
        ),
        "",
        "## Paired differences",
        "",
        seeds_sentence(fams["tiny"]),
        "",
        *pair_tables(fams["tiny"]),
        "",
        "## Machine",
        "",
        f"Model sha256 prefix / torch CPU capability over the runs: {', '.join(machines)}. "
        f"Load average (1 min) at run start and end: mean {(_mean(loads) or 0):.1f}, "
        f"range {min(loads, default=0):.1f}-{max(loads, default=0):.1f}.",
        "",
    ]
    if long:
        lines += long_study.section(long, long_figure, fams["long"], fams["coverage"])
    if first:
        lines += long_study.first_protocol_section(first, fams["first"], fams["first-coverage"])
    if mb:
        lines += minibatch_section(mb, mb_figure, fams["mb"])
    if real:
        lines += smollm2_section(real, real_figure, fams["smollm2"])
    if notes:
        lines += [notes.strip(), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m stare.app.report.results", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--record",
        type=Path,
        nargs="+",
        default=None,
        metavar="RUN_DIR",
        help="write these completed runs' records into --records, and stop",
    )
    p.add_argument("--records", type=Path, default=RECORDS_DIR, help="the records folder (kept in git)")
    p.add_argument("--out", type=Path, default=Path("docs/results.md"))
    p.add_argument("--figures", type=Path, default=Path("docs/results"))
    p.add_argument("--notes", type=Path, default=None, help="markdown appended at the end (the findings)")
    p.add_argument(
        "--long-records",
        type=Path,
        default=long_study.LONG_RECORDS,
        help="the longer-horizon study's records, second protocol (its section is left out while there are none)",
    )
    p.add_argument(
        "--first-long-records",
        type=Path,
        default=long_study.FIRST_PROTOCOL_RECORDS,
        help="the longer-horizon study's first protocol (history; left out while there are none)",
    )
    p.add_argument("--long-figure", type=Path, default=Path("docs/images/horizon.png"))
    p.add_argument(
        "--mb-records",
        type=Path,
        default=MINI_BATCH_RECORDS,
        help="the several-updates-per-batch study's records (its section is left out while there are none)",
    )
    p.add_argument("--mb-figure", type=Path, default=Path("docs/images/minibatch.png"))
    p.add_argument(
        "--smollm2-records",
        type=Path,
        default=SMOLLM2_RECORDS,
        help="the SmolLM2 study's records (its section is left out while there are none)",
    )
    p.add_argument("--smollm2-figure", type=Path, default=Path("docs/images/smollm2.png"))
    args = p.parse_args(argv)
    if args.record:
        for run_dir in args.record:
            print(f"[results] recorded {write_record(run_dir, args.records)}")
        return 0
    data = collect(args.records)
    if not data:
        raise SystemExit(f"--records {args.records}: no record yet (scripts/results.sh runs and records the sweep)")
    figures(data, args.figures)
    rel = str(Path(os.path.relpath(args.figures, args.out.parent)))
    notes = args.notes.read_text() if args.notes else ""
    read = lambda d: collect(d) if d.is_dir() else {}  # noqa: E731
    long, first, mb, real = (
        read(d) for d in (args.long_records, args.first_long_records, args.mb_records, args.smollm2_records)
    )
    if long:
        long_study.figure(long, args.long_figure)
    if mb:
        studies.minibatch_figure(
            mb,
            args.mb_figure,
            ["grpo", *MINI_BATCH_LABELS, *[k for k in mb if "-mb" in k and k not in MINI_BATCH_LABELS]],
        )
    if real:
        studies.smollm2_figure(
            real, args.smollm2_figure, ["stare", "grpo", *[k for k in real if k not in ("stare", "grpo")]]
        )
    rel_of = lambda f: str(Path(os.path.relpath(f, args.out.parent)))  # noqa: E731
    args.out.write_text(
        render(
            data,
            rel,
            notes,
            long,
            rel_of(args.long_figure),
            mb,
            rel_of(args.mb_figure),
            real,
            rel_of(args.smollm2_figure),
            first=first,
        )
    )
    print(f"[results] {args.out} ({sum(len(s) for s in data.values())} runs, {len(data)} labels)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
