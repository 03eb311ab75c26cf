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
import json
import os
import re
from pathlib import Path
from typing import Any

from stare.app.report import horizon, studies
from stare.app.report.stats import pass_at_k_curve
from stare.app.report.study_sections import MINI_BATCH_LABELS, minibatch_section, smollm2_section
from stare.app.report.summary import EVAL_FILE, METRICS_FILE, load_jsonl, summarize
from stare.app.report.tables import COLUMNS, LAST_STEPS, fmt, interval, paired, table  # noqa: F401 (re-exported)

RUN_NAME = re.compile(r"^s(\d+)-(.+)$")
RECORDS_DIR = Path("docs/results/runs")
MINI_BATCH_RECORDS = Path("docs/results/mb")  # several updates per batch: grpo and the -mb variants, one machine
SMOLLM2_RECORDS = Path("docs/results/smollm2")  # STARE and GRPO on SmolLM2-135M-Instruct
RECORD_VERSION = 1
PASS_KS = (1, 2, 4, 8, 16, 32, 64)


def _final_eval(run_dir: Path) -> dict[str, Any] | None:
    """The evaluation after the run's last step (config.yaml's run.steps), None while it runs."""
    import yaml

    evals = load_jsonl(run_dir / EVAL_FILE)
    try:
        steps = yaml.safe_load((run_dir / "config.yaml").read_text())["run"]["steps"]
    except (OSError, KeyError, TypeError):
        return None
    last = evals[-1] if evals else {}
    return last if last.get("step") == steps and last.get("correct_counts") else None


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def update_numbers(metrics: list[dict[str, Any]]) -> dict[str, float | None]:
    """How far a batch's updates moved the policy off the one that sampled it, as the learner logs it
    per step (learner/step/ppo_updates.py), averaged over the steps: optimizer updates per batch, the share of
    loss tokens clipped at 1 - eps_low and at 1 + eps_high, approx-KL (mean -log r) and the ratio's
    spread over every update's tokens, approx-KL of each batch's last update alone, and the tokens a
    covariance rule (Clip-Cov, KL-Cov) selected per step. None for a key the run did not log (records
    of runs made before mini-batches existed)."""

    def mean_of(key: str) -> float | None:
        return _mean([float(r[key]) for r in metrics if r.get(key) is not None])

    last = [
        float(r["per_update"][max(r["per_update"], key=int)]["approx_kl"])
        if r.get("per_update")
        else float(r["approx_kl"])
        for r in metrics
        if r.get("approx_kl") is not None
    ]
    return {
        "updates": mean_of("updates"),
        "clip_low": mean_of("clip_fraction_low"),
        "clip_high": mean_of("clip_fraction_high"),
        "approx_kl": mean_of("approx_kl"),
        "approx_kl_last_update": _mean(last),
        "ratio_std": mean_of("ratio_std"),
        "cov_selected": mean_of("cov_selected_tokens"),
    }


def run_numbers(run_dir: Path) -> dict[str, Any]:
    """One completed run's numbers (None where it has no data)."""
    metrics = load_jsonl(run_dir / METRICS_FILE)
    final = _final_eval(run_dir)
    s = summarize(run_dir)
    entropy = [float(r["entropy"]) for r in metrics if r.get("entropy") is not None]
    w = [float(r["w"]) for r in metrics if r.get("w") is not None]
    inside = [
        r["band_low"] <= r["entropy"] <= r["band_high"]
        for r in metrics[-LAST_STEPS:]
        if r.get("band_low") is not None and r.get("entropy") is not None
    ]
    counts = final["correct_counts"] if final else []
    curve = pass_at_k_curve(counts, PASS_KS)
    load = None
    if (run_dir / "load.txt").is_file():
        loads = [float(line.split()[3]) for line in (run_dir / "load.txt").read_text().splitlines() if "load" in line]
        load = _mean(loads)
    return {
        "entropy_last": _mean(entropy[-LAST_STEPS:]),
        "in_band": s["in_band_fraction"],
        "in_band_last": _mean([float(x) for x in inside]),
        "greedy_first": s["greedy_accuracy_first"],
        "greedy_last": final["greedy_accuracy"] if final else None,
        "avg_at_n": final["avg_at_k"] if final else None,
        **{f"pass@{k}": v for k, v in zip(PASS_KS, curve)},
        "step_s": _mean([float(r["time_step_s"]) for r in metrics if r.get("time_step_s") is not None]),
        "w_variation": _mean([abs(a - b) for a, b in zip(w[1:], w[:-1])]) if len(w) > 1 else None,
        "w_mean": _mean(w),
        "gate_on": s["gate_on_fraction"],
        "load": load,
        "steps": len(metrics),
        "model_sha256": ((s.get("machine") or {}).get("model") or {}).get("sha256"),
        "cpu_capability": ((s.get("machine") or {}).get("torch") or {}).get("cpu_capability"),
        "entropy_curve": ([int(r["step"]) for r in metrics], [round(float(r["entropy"]), 5) for r in metrics]),
        "band": (metrics[-1].get("band_low"), metrics[-1].get("band_high"), metrics[-1].get("target"))
        if metrics
        else None,
        "eval_curve": horizon.eval_curve(load_jsonl(run_dir / EVAL_FILE)),
        **update_numbers(metrics),
    }


def record(run_dir: Path) -> dict[str, Any] | None:
    """A completed run's record (None while it runs or if the folder is not named s<seed>-<label>)."""
    m = RUN_NAME.match(run_dir.name)
    if m is None or not run_dir.is_dir() or _final_eval(run_dir) is None:
        return None
    numbers = run_numbers(run_dir)
    return {
        "record": RECORD_VERSION,
        "name": run_dir.name,
        "label": m.group(2),
        "seed": int(m.group(1)),
        "machine": fingerprint(numbers),
        **numbers,
    }


def fingerprint(numbers: dict[str, Any]) -> str:
    """The machine a run's numbers came from, as far as they depend on it: the model build's sha256
    prefix and torch's CPU kernels."""
    return f"{(numbers['model_sha256'] or 'none')[:12]}/{numbers['cpu_capability']}"


def write_record(run_dir: Path, records_dir: Path = RECORDS_DIR) -> Path:
    rec = record(run_dir)
    if rec is None:
        raise SystemExit(
            f"--record {run_dir}: not a completed run (a folder s<seed>-<label> whose eval.jsonl "
            "holds the evaluation after its last step)"
        )
    records_dir.mkdir(parents=True, exist_ok=True)
    out = records_dir / f"{rec['name']}.json"
    out.write_text(json.dumps(rec, separators=(",", ":")) + "\n")
    return out


def collect(records_dir: Path = RECORDS_DIR) -> dict[str, dict[int, dict[str, Any]]]:
    """label -> seed -> numbers from the records, labels in order of first appearance by name."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for f in sorted(Path(records_dir).glob("*.json"), key=lambda p: p.name):
        rec = json.loads(f.read_text())
        if rec.get("record") != RECORD_VERSION:
            raise SystemExit(
                f"{f}: record version {rec.get('record')!r}, this report reads {RECORD_VERSION} "
                "(record the run again: python -m stare.app.report.results --record <run folder>)"
            )
        out.setdefault(rec["label"], {})[int(rec["seed"])] = rec
    return out


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
