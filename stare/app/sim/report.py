"""What a simulation says: throughput, busy fractions, the critical path and the bottleneck, and the
Gantt chart (one row per GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stare.app.sim.lanes import KINDS
from stare.app.sim.node import SimRun

COLORS = {
    "decode": "#1f77b4",
    "prefill": "#aec7e8",
    "train": "#2ca02c",
    "send/receive": "#d62728",
    "checkpoint": "#9467bd",
}


def summarize(run: SimRun, warmup: int) -> dict[str, Any]:
    """Figures over the steps after `warmup` (the start fills the pipeline)."""
    ends = run.step_ends
    if len(ends) <= warmup + 1:
        raise ValueError(f"{len(ends)} steps simulated: need more than warmup + 1 = {warmup + 1}")
    t0, t1 = ends[warmup][0], ends[-1][0]
    steps = len(ends) - 1 - warmup
    tokens = sum(n for _, n in ends[warmup + 1 :])
    # checkpoints: each step is charged its share of one write (checkpoint_s / checkpoint_every), the learner
    # waiting. A write the session made inside the window (a multiple of checkpoint_every among the measured
    # steps) is taken out of the span first, so that it is not charged on top of its share
    ckpt = run.checkpoint_s / run.checkpoint_every if run.checkpoint_every else 0.0
    written = run.learner.busy_in(t0, t1)["checkpoint"]
    # the held-out evaluation likewise: its share of one evaluation a step, the learner waiting and the
    # rollout engines sampling it (stare/app/sim/evaluation.py)
    evals = run.eval_s / run.eval_every if run.eval_every else 0.0
    span = max(t1 - t0 - written, 1e-12) + (ckpt + evals) * steps
    d = run.design
    per_gpu: dict[int, dict[str, float]] = {}
    for g in range(d.gpus):
        busy = dict.fromkeys(KINDS, 0.0)
        for lane in run.lanes:
            if g in lane.gpus:
                for k, v in lane.busy_in(t0, t1).items():
                    busy[k] += v
        if g < d.learner_gpus:
            busy["checkpoint"] = ckpt * steps
        if d.colocated and g == 0 or not d.colocated and g >= d.learner_gpus:
            busy["decode"] += evals * steps  # the engines that sample the evaluation (colocated: rank 0's)
        per_gpu[g] = {k: v / span for k, v in busy.items()}
    learner = {k: v / steps for k, v in run.learner.busy_in(t0, t1).items()}
    learner["checkpoint"] = ckpt
    learner_busy = sum(learner.values())  # the evaluation is waiting, not busy
    wait = span / steps - learner_busy - evals
    rollout_gpus = [g for g in range(d.gpus) if d.colocated or g >= d.learner_gpus]
    decode = sum(per_gpu[g]["decode"] + per_gpu[g]["prefill"] for g in rollout_gpus) / max(len(rollout_gpus), 1)
    rollout_recv = 0.0
    if not d.colocated:
        for lane in run.lanes[1:]:
            rollout_recv += lane.busy_in(t0, t1)["send/receive"] / steps / (len(run.lanes) - 1)
    publish = learner["send/receive"] + (rollout_recv if d.max_staleness == 0 else 0.0)
    path = {
        "wait for rollout": max(wait, 0.0),
        "train": learner["train"],
        "weight publish": learner["send/receive"],
        "checkpoint": learner["checkpoint"],
        "evaluation": evals,
    }
    # the side busier than the other is the one the other waits for
    learner_side = learner_busy * steps / span
    if d.colocated:
        bottleneck = max(path, key=path.get)
    elif decode >= learner_side:
        bottleneck = f"rollout decode ({decode:.0%} busy; the learner waits {max(wait, 0.0):.1f} s a step)"
    else:
        bottleneck = f"learner ({learner_side:.0%} busy; the largest piece: {max(path, key=path.get)})"
    if evals > 0.1 * span / steps:  # a large piece of its own: the learner waits for every evaluation
        bottleneck += f"; the held-out evaluation {evals:.1f} s a step (every {run.eval_every} steps)"
    last = run.metrics[-1] if run.metrics else {}
    learner_frac = (
        learner_busy * steps / span
        if not d.colocated
        else sum(per_gpu[g]["train"] for g in range(d.learner_gpus)) / max(d.learner_gpus, 1)
    )
    return {
        "design": vars(d),
        "steps_measured": steps,
        "s_per_step": span / steps,
        "tokens_per_s_per_gpu": tokens / span / d.gpus,
        "tokens_per_step": tokens / steps,
        "rollout_decoding_fraction": decode,
        "learner_busy_fraction": learner_frac,
        "weight_publish_critical_s": publish,
        "critical_path_s_per_step": path,
        "bottleneck": bottleneck,
        "gpu_busy": {str(g): {k: round(v, 4) for k, v in b.items()} for g, b in per_gpu.items()},
        "window_s": [t0, t1],
        # from the real session's metrics: what the collector did with the groups
        "groups_filtered_total": last.get("filtered_groups_total"),
        "groups_stale_total": last.get("stale_groups_total"),
        "groups_surplus_total": last.get("surplus_groups_total"),
        "stale_tokens_total": last.get("stale_tokens_total"),
        "response_length_mean": (
            sum(m.get("response_length_mean", 0.0) for m in run.metrics[warmup + 1 :])
            / max(len(run.metrics) - warmup - 1, 1)
        ),
        "sampling_rounds_mean": sum(m.get("sampling_rounds", 0) for m in run.metrics) / max(len(run.metrics), 1),
    }


def band_of(by_corner: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The central summary with `band`: each figure's [low, high] over the corners (stare/app/sim/bands.py)."""
    central = dict(by_corner["central"])
    keys = [
        "tokens_per_s_per_gpu",
        "s_per_step",
        "tokens_per_step",
        "rollout_decoding_fraction",
        "learner_busy_fraction",
        "weight_publish_critical_s",
    ]
    band: dict[str, Any] = {
        k: [min(s[k] for s in by_corner.values()), max(s[k] for s in by_corner.values())] for k in keys
    }
    band["critical_path_s_per_step"] = {
        k: [
            min(s["critical_path_s_per_step"][k] for s in by_corner.values()),
            max(s["critical_path_s_per_step"][k] for s in by_corner.values()),
        ]
        for k in central["critical_path_s_per_step"]
    }
    band["bottleneck"] = {c: s["bottleneck"] for c, s in by_corner.items()}
    band["corners"] = {c: {k: s[k] for k in keys} for c, s in by_corner.items()}
    central["band"] = band
    return central


def render(s: dict[str, Any]) -> str:
    """The summary as text; with a band (`band_of`), every figure as `central [low, high]`."""
    d, band = s["design"], s.get("band")

    def fig(key: str, fmt: str, sub: str | None = None) -> str:
        value = s[key] if sub is None else s[key][sub]
        text = format(value, fmt)
        if band is not None:
            lo, hi = band[key] if sub is None else band[key][sub]
            text += f" [{format(lo, fmt)}, {format(hi, fmt)}]"
        return text

    if band is None:
        bottleneck = s["bottleneck"]
    else:
        by = band["bottleneck"]
        bottleneck = by["central"] + (
            "" if len(set(by.values())) == 1 else "; " + "; ".join(f"{c}: {b}" for c, b in by.items() if c != "central")
        )
    lines = [
        f"{d['gpus']} GPUs: {'colocated' if d['colocated'] else str(d['learner_gpus']) + ' learner + ' + str(d['gpus'] - d['learner_gpus']) + ' rollout'}"
        f", max_staleness {d['max_staleness']}, {'streaming' if d['streaming'] else 'blocking'} rollout"
        f"{' + in-flight updates' if d['inflight'] else ''}, {'eager' if d['eager'] else 'CUDA graphs'}, "
        f"publish from {d['publish_from']}",
        *(["figures: central [low, high] over the cost model's corners (stare sim --constants)"] if band else []),
        f"tokens/s/GPU      {fig('tokens_per_s_per_gpu', ',.0f')}",
        f"s/step            {fig('s_per_step', '.2f')}  ({s['steps_measured']} steps measured, {fig('tokens_per_step', ',.0f')} tokens/step)",
        f"rollout decoding  {fig('rollout_decoding_fraction', '.0%')} of the time",
        f"learner busy      {fig('learner_busy_fraction', '.0%')}",
        f"weight publish    {fig('weight_publish_critical_s', '.2f')} s on the critical path per step",
        "critical path     "
        + ", ".join(f"{k} {fig('critical_path_s_per_step', '.2f', k)} s" for k in s["critical_path_s_per_step"]),
        f"bottleneck        {bottleneck}",
        f"groups            {s['groups_filtered_total']} filtered (equal rewards), {s['groups_stale_total']} dropped stale, "
        f"{s['groups_surplus_total'] or 0} surplus dropped (data.oversample), {s['sampling_rounds_mean']:.1f} sampling "
        f"rounds a step; trained responses {s['response_length_mean']:,.0f} tokens on average"
        + (
            f"; {s['stale_tokens_total']:,} tokens older than max_staleness left out of the loss"
            if s.get("stale_tokens_total")
            else ""
        ),
        "busy per GPU      " + "  ".join(f"{g}:{sum(b.values()):.0%}" for g, b in s["gpu_busy"].items()),
    ]
    return "\n".join(lines)


def gantt(run: SimRun, summary: dict[str, Any], path: Path, steps: int = 3, title: str = "") -> Path:
    """One row per GPU (decode, prefill, train, send/receive, checkpoint; white = idle) over `steps`
    measured steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = summary["window_s"][0]
    ends = [t for t, _ in run.step_ends if t > t0]
    t1 = ends[min(steps, len(ends)) - 1] if ends else summary["window_s"][1]
    d = run.design
    fig, ax = plt.subplots(figsize=(11, 0.45 * d.gpus + 1.6))
    for lane in run.lanes:
        for g in lane.gpus:
            bars = {}
            for a, b, kind in lane.intervals:
                if b > t0 and a < t1:
                    bars.setdefault(kind, []).append((max(a, t0) - t0, min(b, t1) - max(a, t0)))
            for kind, xs in bars.items():
                ax.broken_barh(xs, (g - 0.4, 0.8), color=COLORS[kind], label=kind)
    for t in ends[:steps]:
        ax.axvline(t - t0, color="k", lw=0.6, ls=":")
    handles = {h.get_label(): h for h in ax.get_legend_handles_labels()[0]}
    ax.legend(handles.values(), handles.keys(), loc="upper right", fontsize=8, ncol=5)
    ax.set_yticks(range(d.gpus))
    ax.set_yticklabels(
        [f"GPU {g}" + (" (learner)" if g < d.learner_gpus and not d.colocated else "") for g in range(d.gpus)]
    )
    ax.invert_yaxis()
    ax.set_xlabel("seconds (dotted: step ends)")
    ax.set_ylim(d.gpus - 0.5, -1.3)
    ax.set_title(
        title or f"stare sim: {summary['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, {summary['s_per_step']:.1f} s/step"
    )
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
