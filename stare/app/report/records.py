"""A sweep's run records (scripts/results.sh): a completed run folder `s<seed>-<label>` becomes
`<records>/<name>.json`, its numbers, entropy curve and machine fingerprint, a few KB kept in git, so that
a sweep longer than one sitting accumulates across sessions and the report (results.py) is regenerated
from what is kept."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from stare.app.report import horizon
from stare.app.report.stats import pass_at_k_curve
from stare.app.report.summary import EVAL_FILE, METRICS_FILE, load_jsonl, summarize
from stare.app.report.tables import LAST_STEPS
from stare.observe.files import write_atomic

RUN_NAME = re.compile(r"^s(\d+)-(.+)$")
RECORDS_DIR = Path("docs/results/runs")
MINI_BATCH_RECORDS = Path("docs/results/mb")  # several updates per batch: grpo and the -mb variants, one machine
SMOLLM2_RECORDS = Path("docs/results/smollm2")  # STARE and GRPO on SmolLM2-135M-Instruct
RECORD_VERSION = 1
PASS_KS = (1, 2, 4, 8, 16, 32, 64)


def _final_eval(run_dir: Path) -> dict[str, Any] | None:
    """The evaluation after the run's last step (config.yaml's run.steps, or the one marked final: also a run
    that data.epochs ended), None while it runs."""
    import yaml

    evals = load_jsonl(run_dir / EVAL_FILE)
    try:
        steps = yaml.safe_load((run_dir / "config.yaml").read_text())["run"]["steps"]
    except (OSError, KeyError, TypeError):
        return None
    last = evals[-1] if evals else {}
    done = last.get("step") == steps or bool(last.get("final"))
    return last if done and last.get("correct_counts") else None


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
    write_atomic(out, json.dumps(rec, separators=(",", ":")) + "\n")
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
