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
between runs on the same machine fingerprint (model build and CPU kernels).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from stare.app.report import horizon, studies
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
from stare.app.report.study_sections import MINI_BATCH_LABELS, minibatch_section, smollm2_section
from stare.app.report.tables import COLUMNS, LAST_STEPS, fmt, interval, paired, table  # noqa: F401 (re-exported)


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


def horizon_section(data, figure: str) -> list[str]:
    """The longer-horizon study: its curves, per-step tables and final numbers."""
    steps = sorted({n["steps"] for s in data.values() for n in s.values()})
    diffs = horizon.paired_curve(data.get("stare", {}), data.get("grpo", {}), "pass@1")
    cross = horizon.crossing(diffs)
    last = diffs[-1] if diffs else None
    if not diffs:
        verdict = "No STARE and GRPO seed pair has completed on one machine fingerprint yet."
    else:
        verdict = (
            f"Paired over {len(horizon.same_machine_seeds(data['stare'], data['grpo']))} seeds, STARE's held-out pass@1 "
            f"minus GRPO's at step {last[0]} is {last[1]:+.3f} [{last[2]:+.3f}, {last[3]:+.3f}]. "
        )
        verdict += (
            f"The mean difference turns non-negative at step {cross['means']} and stays so to the last evaluation"
            if cross["means"] is not None
            else "The mean difference is negative at the last evaluation"
        )
        verdict += (
            f"; its 95% interval first lies above zero at step {cross['separated']}."
            if cross["separated"] is not None
            else "; its 95% interval never lies above zero."
        )
    machines = sorted({n["machine"] for s in data.values() for n in s.values()})
    points = next(
        (n["eval_curve"] for s in data.values() for n in s.values() if len(n.get("eval_curve") or []) > 1), []
    )
    every = points[1]["step"] - points[0]["step"] if points else None
    return [
        f"## Longer horizon ({', '.join(map(str, steps))} steps)",
        "",
        f"The same tiny config trained longer, evaluated every {every} steps with 64 samples per held-out problem "
        "(128 problems, temperature 1) and greedily: runs kept in `docs/results/long/` "
        "(scripts/results.sh, the study's command in its header).",
        "",
        f"![longer horizon]({figure})",
        "",
        verdict,
        "",
        *horizon.curve_table(data, "stare", "grpo", "pass@1"),
        "",
        *horizon.curve_table(data, "stare", "grpo", "pass@64"),
        "",
        *table(data),
        "",
        *paired(data, "stare", "grpo", ["entropy_last", "greedy_last", "pass@1", "pass@8", "pass@64"]),
        "",
        f"Machines (model sha256 prefix / torch CPU capability): {', '.join(machines)}.",
        "",
    ]


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
) -> str:
    machines = sorted({n["machine"] for s in data.values() for n in s.values()})
    loads = [n["load"] for s in data.values() for n in s.values() if n["load"] is not None]
    lines = [
        "# Results on the tiny config",
        "",
        "Generated by `scripts/results.sh` (`python -m stare.app.report.results`); do not edit by hand. "
        "Every number is the mean over seeds and a 95% percentile-bootstrap interval "
        "(10,000 resamples of the seeds, numpy seed 0).",
        "",
        f"![entropy]({figure_dir}/entropy.png)",
        "",
        f"![pass@k]({figure_dir}/pass_at_k.png)",
        "",
        "## All runs",
        "",
        *table(data),
        "",
        f"Entropy: mean batch entropy over the last {LAST_STEPS} steps. In band: from the first step inside "
        "the band, the share of steps inside it (GRPO and the baselines are measured against STARE's band, "
        "logged for every algorithm). Greedy accuracy at start / end: the first and final held-out evaluation "
        "(128 problems). pass@k: unbiased estimator (Chen et al. 2021) from the final evaluation's 64 samples "
        "per problem at temperature 1; pass@1 is avg@64. Wall time: mean `time_step_s` (sampling, scoring, "
        "learning) on a shared 2-core machine.",
        "",
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
        *paired(data, "stare", "grpo", ["entropy_last", "greedy_last", "pass@1", "pass@8", "pass@64"]),
        "",
        *paired(data, "stare", "stare-pctl", ["w_variation", "in_band", "entropy_last", "greedy_last", "pass@64"]),
        "",
        "## Machine",
        "",
        f"Model sha256 prefix / torch CPU capability over the runs: {', '.join(machines)}. "
        f"Load average (1 min) at run start and end: mean {(_mean(loads) or 0):.1f}, "
        f"range {min(loads, default=0):.1f}-{max(loads, default=0):.1f}.",
        "",
    ]
    if long:
        lines += horizon_section(long, long_figure)
    if mb:
        lines += minibatch_section(mb, mb_figure)
    if real:
        lines += smollm2_section(real, real_figure)
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
        default=horizon.HORIZON_RECORDS,
        help="the longer-horizon study's records (its section is left out while there are none)",
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
    long = collect(args.long_records) if args.long_records.is_dir() else {}
    if long:
        horizon.figure(long, args.long_figure, ["stare", "grpo", *[k for k in long if k not in ("stare", "grpo")]])
    long_rel = str(Path(os.path.relpath(args.long_figure, args.out.parent)))
    mb = collect(args.mb_records) if args.mb_records.is_dir() else {}
    if mb:
        studies.minibatch_figure(
            mb,
            args.mb_figure,
            ["grpo", *MINI_BATCH_LABELS, *[k for k in mb if "-mb" in k and k not in MINI_BATCH_LABELS]],
        )
    real = collect(args.smollm2_records) if args.smollm2_records.is_dir() else {}
    if real:
        studies.smollm2_figure(
            real, args.smollm2_figure, ["stare", "grpo", *[k for k in real if k not in ("stare", "grpo")]]
        )
    rel_of = lambda f: str(Path(os.path.relpath(f, args.out.parent)))  # noqa: E731
    args.out.write_text(
        render(data, rel, notes, long, long_rel, mb, rel_of(args.mb_figure), real, rel_of(args.smollm2_figure))
    )
    print(f"[results] {args.out} ({sum(len(s) for s in data.values())} runs, {len(data)} labels)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
