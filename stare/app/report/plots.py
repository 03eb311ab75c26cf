"""The figures of one run (`write_report`: report.png, one PNG per panel, summary.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from stare.app.report.summary import (
    EMA_BETA,
    EVAL_FILE,
    IMPLIED_BAND_REL,
    METRICS_FILE,
    REPORT_DIR,
    _band_note,
    _bands,
    _fmt,
    _fmt_duration,
    _fmt_pct,
    _last,
    _series,
    _summary_markdown,
    ema,
    load_jsonl,
    summarize,
)
from stare.observe.files import write_atomic

if TYPE_CHECKING:  # matplotlib is imported inside the functions that draw
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# ---------------------------------------------------------------------------------------------
# Drawing one run


def save_figure(fig: Figure, path: Path, **kwargs: Any) -> None:
    """`fig` as a PNG at `path`, replaced at once (a reader never sees half a picture; stare.observe.files)."""
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", **kwargs)
    write_atomic(path, buffer.getvalue())


def _raw_and_ema(ax: Axes, steps: list[float], values: list[float], color: str, label: str) -> None:
    """Raw values as faint points, the EMA as a line (labelled)."""
    ax.plot(steps, values, ".", color=color, alpha=0.3, markersize=3)
    ax.plot(steps, ema(values), "-", color=color, linewidth=1.6, label=f"{label} (EMA {EMA_BETA})")


def _no_data(ax: Axes, title: str, text: str) -> None:
    """An empty panel that says what is missing (no ticks, so it cannot be read as data)."""
    ax.set(title=title, xticks=[], yticks=[])
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")


def _shade_gate(ax: Axes, metrics: list[dict[str, Any]]) -> None:
    """Shade contiguous runs of gate-on steps (each step covers [step - 0.5, step + 0.5])."""
    spans: list[list[float]] = []
    for s, g in zip(*_series(metrics, "gate")):
        if g <= 0:
            continue
        if spans and s - spans[-1][1] <= 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    for i, (a, b) in enumerate(spans):
        ax.axvspan(a - 0.5, b + 0.5, color="tab:red", alpha=0.10, linewidth=0, label="gate on" if i == 0 else None)


def _plot_entropy(ax: Axes, metrics: list[dict[str, Any]]) -> None:
    steps, h = _series(metrics, "entropy")
    if not steps:
        return _no_data(ax, "Policy entropy", "no entropy logged")
    band_steps, lows, highs, source = _bands(metrics)
    if band_steps:
        label = "band" if source == "logged" else f"target ±{IMPLIED_BAND_REL:.0%} (no band logged)"
        ax.fill_between(band_steps, lows, highs, step="mid", color="tab:green", alpha=0.18, linewidth=0, label=label)
    target = _series(metrics, "target")
    if target[0]:
        ax.plot(*target, "--", color="tab:green", linewidth=1.2, label="target")
    _shade_gate(ax, metrics)
    _raw_and_ema(ax, steps, h, "tab:blue", "entropy")
    ax.set(title="Policy entropy", xlabel="step", ylabel="mean token entropy (nats)")
    ax.legend(fontsize=8, loc="best")


def _plot_reward(ax: Axes, metrics: list[dict[str, Any]]) -> None:
    drawn = False
    for key, color, label in (("reward_mean", "tab:purple", "reward"), ("accuracy", "tab:orange", "train accuracy")):
        steps, values = _series(metrics, key)
        if steps:
            _raw_and_ema(ax, steps, values, color, label)
            drawn = True
    if not drawn:
        return _no_data(ax, "Training reward", "no reward or accuracy logged")
    ax.set(title="Training reward", xlabel="step", ylabel="mean reward / fraction correct")
    ax.legend(fontsize=8, loc="best")


def _plot_heldout(ax: Axes, evals: list[dict[str, Any]]) -> None:
    k = _last(_series(evals, "k")[1])
    k_txt = "k" if k is None else str(int(k))
    drawn = False
    for key, marker, label in (("greedy_accuracy", "o-", "greedy accuracy"), ("pass_at_k", "s-", f"pass@{k_txt}"),
                               ("avg_at_k", "^--", f"avg@{k_txt}")):  # fmt: skip
        steps, values = _series(evals, key)
        if steps:
            ax.plot(steps, values, marker, markersize=4, linewidth=1.4, label=label)
            drawn = True
    if not drawn:
        return _no_data(ax, "Held-out evaluation", "no held-out evaluations")
    ax.set(title="Held-out evaluation", xlabel="step", ylabel="accuracy", ylim=(-0.02, 1.02))
    ax.legend(fontsize=8, loc="best")


def _plot_length(ax: Axes, metrics: list[dict[str, Any]]) -> None:
    steps, values = _series(metrics, "response_length_mean")
    if not steps:
        return _no_data(ax, "Response length", "no response length logged")
    _raw_and_ema(ax, steps, values, "tab:brown", "mean response length")
    ax.set(title="Response length", xlabel="step", ylabel="tokens")
    ax.legend(fontsize=8, loc="best")


def _plot_controller(ax: Axes, metrics: list[dict[str, Any]]) -> None:
    gate = _series(metrics, "gate")[1]
    w, m = _series(metrics, "w"), _series(metrics, "m")
    if not gate and not w[0] and not m[0]:
        return _no_data(ax, "Controller", "no gate, W or M logged (baseline run)")
    _shade_gate(ax, metrics)
    if w[0]:
        ax.plot(*w, "-", color="tab:red", linewidth=1.4, label="W (L+: positive advantage, high surprisal)")
    if m[0]:
        ax.plot(*m, "-", color="tab:cyan", linewidth=1.4, label="M (L-: negative advantage, high surprisal)")
    on = f", gate on {sum(g > 0 for g in gate) / len(gate):.0%} of steps" if gate else ""
    ax.set(title=f"Controller{on}", xlabel="step", ylabel="W / M")
    if gate and not w[0] and not m[0]:  # only the gate: give the axis the gate's 0/1 scale
        ax.set(ylim=(0, 1), ylabel="gate")
    ax.legend(fontsize=8, loc="best")


def _plot_summary_text(ax: Axes, s: dict[str, Any]) -> None:
    ax.axis("off")
    text = "\n".join([
        f"run: {s['run']}   algo: {_fmt(s['algo'])}",
        f"steps: {s['steps']}   wall time: {_fmt_duration(s['wall_time_s'])}",
        f"entropy first/last/min: {_fmt(s['entropy_first'], 3)} / {_fmt(s['entropy_last'], 3)} / "
        f"{_fmt(s['entropy_min'], 3)}",
        f"in band after entering: {_fmt_pct(s['in_band_fraction'])}   gate on: {_fmt_pct(s['gate_on_fraction'])}",
        f"band: {_band_note(s['band_source'])}",
        f"held-out greedy first/last: {_fmt(s['greedy_accuracy_first'], 3)} / {_fmt(s['greedy_accuracy_last'], 3)}",
        f"held-out pass@{s['k'] or 'k'} first/last: {_fmt(s['pass_at_k_first'], 3)} / {_fmt(s['pass_at_k_last'], 3)}",
        f"final W / M: {_fmt(s['w_final'], 3)} / {_fmt(s['m_final'], 3)}",
    ])  # fmt: skip
    ax.text(0.02, 0.95, text, va="top", ha="left", family="monospace", fontsize=9, transform=ax.transAxes)


def write_report(run_dir: Path) -> Path:
    """Write `run_dir/report/` (report.png, entropy/reward/heldout/response_length/controller.png,
    summary.md) and return that directory."""
    from matplotlib.figure import Figure  # rendered by Agg on savefig; no pyplot state

    run_dir = Path(run_dir)
    out = run_dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    metrics = load_jsonl(run_dir / METRICS_FILE)
    evals = load_jsonl(run_dir / EVAL_FILE)
    summary = summarize(run_dir)
    panels = {
        "entropy": lambda ax: _plot_entropy(ax, metrics),
        "reward": lambda ax: _plot_reward(ax, metrics),
        "heldout": lambda ax: _plot_heldout(ax, evals),
        "response_length": lambda ax: _plot_length(ax, metrics),
        "controller": lambda ax: _plot_controller(ax, metrics),
    }
    fig = Figure(figsize=(15, 12), layout="constrained")
    axes = fig.subplots(3, 2).ravel()
    for ax, draw in zip(axes, panels.values()):
        draw(ax)
    _plot_summary_text(axes[-1], summary)
    fig.suptitle(f"{summary['run']} ({_fmt(summary['algo'])})", fontsize=14)
    save_figure(fig, out / "report.png", dpi=100)
    for name, draw in panels.items():
        fig = Figure(figsize=(8, 4.5), layout="constrained")
        draw(fig.subplots())
        save_figure(fig, out / f"{name}.png", dpi=100)
    write_atomic(out / "summary.md", _summary_markdown(summary))
    return out
