"""`stare sim --from-run RUN`: a run's measured step pieces beside the model's prediction for the same config.

It reads RUN/config.yaml (the config the run started with) and RUN/metrics.jsonl (per step: time_step_s, the
learner's time_learn_s + time_plan_s, time_wait_data_s, time_prepare_s, time_publish_s, response_length_mean,
filtered_groups, groups), fits the workload to the run (the response-length mean, and solve rates Beta(a, a)
whose all-equal-group probability is the run's filtered fraction), simulates the run's own design on the node
the arguments give (`--gpu KIND --gpus N`, or `--gpu cpu --profile P` for a run on this machine) and prints,
piece by piece, measured against modelled (medians over the steps after the first), the biggest disagreement,
and the knob the model says would help most (one change at a time: max_staleness, the learner/rollout split,
data.oversample, in-flight weight updates).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

PIECES = [  # (label, the metric(s) summed, the model's figure)
    ("step", ("time_step_s",), "s_per_step"),
    ("learner train", ("time_learn_s", "time_plan_s"), "train"),
    ("wait for data", ("time_wait_data_s",), "wait for rollout"),
    ("weight publish", ("time_publish_s",), "weight publish"),
]


def read_run(run: Path) -> tuple[Any, list[dict[str, Any]]]:
    """(the run's config, its per-step metrics); a ValueError naming what is missing."""
    from stare.config import load_config

    run = Path(run)
    for name in ("config.yaml", "metrics.jsonl"):
        if not (run / name).is_file():
            raise ValueError(f"--from-run {run}: no {name} there; pass a run folder (runs/<name>) that trained a step")
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if len(metrics) < 2:
        raise ValueError(f"--from-run {run}: {len(metrics)} step(s) in metrics.jsonl; need at least 2")
    return load_config(run / "config.yaml"), metrics


def measured(metrics: list[dict[str, Any]], skip: int = 1) -> dict[str, float]:
    """Each piece's median over the steps after the first `skip`."""
    rows = metrics[skip:] or metrics
    out = {}
    for label, keys, _ in PIECES:
        vals = [sum(float(m.get(k) or 0.0) for k in keys) for m in rows if any(k in m for k in keys)]
        if vals:
            out[label] = statistics.median(vals)
    return out


def solve_beta_for(filtered: float, n: int) -> float:
    """a such that a group of n samples from a prompt with solve rate ~ Beta(a, a) scores all-equal with
    probability `filtered` (E[p^n + (1 - p)^n]; 2/(n + 1) at a = 1), by bisection on log a."""

    def betaln(x: float, y: float) -> float:
        return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)

    def all_equal(a: float) -> float:
        return 2 * math.exp(betaln(a + n, a) - betaln(a, a))

    filtered = min(max(filtered, 1e-4), 0.999)
    lo, hi = math.log(1e-3), math.log(1e3)
    for _ in range(80):  # all_equal falls as a grows
        mid = (lo + hi) / 2
        if all_equal(math.exp(mid)) > filtered:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def workload_of(cfg, metrics: list[dict[str, Any]]) -> list[str]:
    """`--set` overrides that make the sim's workload the run's."""
    out = []
    lengths = [m["response_length_mean"] for m in metrics if m.get("response_length_mean")]
    if lengths:
        out.append(f"sim.response_mean={statistics.fmean(lengths):.1f}")
    filtered = sum(m.get("filtered_groups", 0) for m in metrics)
    trained = sum(m.get("groups", 0) for m in metrics)
    if cfg.data.dynamic_sampling and filtered + trained:
        a = solve_beta_for(filtered / (filtered + trained), cfg.rollout.samples_per_prompt)
        out += [f"sim.solve_a={a:.4g}", f"sim.solve_b={a:.4g}"]
    return out


def modelled(summary: dict[str, Any]) -> dict[str, float]:
    path = summary["critical_path_s_per_step"]
    return {label: summary[key] if key == "s_per_step" else path.get(key, 0.0) for label, _, key in PIECES}


def render(run: Path, meas: dict[str, float], model: dict[str, float], knob: str) -> str:
    lines = [
        f"{run}: measured (median over the steps after the first) vs modelled (stare sim, this node)",
        "  piece            measured s   modelled s   modelled / measured",
    ]
    worst, worst_gap = None, 0.0
    for label in model:
        if label not in meas:
            continue
        m, p = meas[label], model[label]
        ratio = p / m if m > 0 else float("inf")
        lines.append(f"  {label:<15}  {m:>10.3f}   {p:>10.3f}   {ratio:>8.2f}")
        gap = abs(p - m)
        if gap > worst_gap:
            worst, worst_gap = label, gap
    if worst is not None:
        lines.append(f"biggest disagreement: {worst} (model {model[worst]:.3f} s, run {meas[worst]:.3f} s a step)")
    lines.append(f"the knob the model says helps most: {knob}")
    return "\n".join(lines)


def knob_advice(cfg, base_tps: float, simulate_with) -> str:
    """One change at a time (`simulate_with(overrides)` gives its tokens/s/GPU); the one with the largest
    modelled gain, or that none helps."""
    from stare.config import ConfigError

    s = cfg.system
    tries = {
        f"system.max_staleness={1 if s.max_staleness == 0 else 0}": [
            f"system.max_staleness={1 if s.max_staleness == 0 else 0}"
        ],
        f"data.oversample={1.2 if cfg.data.oversample == 1.0 else 1.0:g}": [
            f"data.oversample={1.2 if cfg.data.oversample == 1.0 else 1.0:g}"
        ],
    }
    if s.max_staleness > 0:
        flag = "false" if s.inflight_weight_updates else "true"
        tries[f"system.inflight_weight_updates={flag}"] = [f"system.inflight_weight_updates={flag}"]
    best, gain = None, 0.0
    for name, over in tries.items():
        try:
            tps = simulate_with(over)
        except (ValueError, ConfigError):  # a change the config refuses is no advice
            continue
        if tps / base_tps - 1 > gain:
            best, gain = name, tps / base_tps - 1
    return f"--set {best} ({gain:+.0%} tokens/s/GPU, modelled)" if best else "none of the one-knob changes helps"
