"""Prometheus text exposition (format 0.0.4) of the run's latest state, written by hand: a handful of
gauges need no client library. Pure: state in, text out."""

from __future__ import annotations

from typing import Any

# metric name -> (metrics key, help)
_STEP_GAUGES = {
    "stare_entropy": ("entropy", "Batch-mean token entropy of the last step (nats)"),
    "stare_entropy_target": ("target", "Entropy target of the last step"),
    "stare_entropy_band_low": ("band_low", "Lower edge of the entropy band"),
    "stare_entropy_band_high": ("band_high", "Upper edge of the entropy band"),
    "stare_gate": ("gate", "1 while STARE reweights (entropy under target)"),
    "stare_w": ("w", "W, the weight on high-surprisal positive-advantage tokens"),
    "stare_m": ("m", "M, the weight on high-surprisal negative-advantage tokens"),
    "stare_reward_mean": ("reward_mean", "Mean reward of the last step's trajectories"),
    "stare_response_length_mean": ("response_length_mean", "Mean response length (tokens)"),
    "stare_step_time_seconds": ("time_step_s", "Wall time of the last step"),
    "stare_tokens_per_second": ("tokens_per_s", "Response tokens per second of the last step"),
    "stare_staleness_max": ("staleness_max", "Largest weight-version lag trained on in the last step"),
    "stare_nonfinite_steps": ("nonfinite_steps", "Steps so far whose loss or gradient norm was NaN or infinite"),
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, (int, float)) else None


def render(run_id: str, last: dict[str, Any] | None, status: dict[str, Any] | None, roles: list[Any],
           paused: bool) -> str:
    lines: list[str] = []

    def gauge(name: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> None:
        if not samples:
            return
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} gauge"])
        lines.extend(f"{name}{_labels(run_id=run_id, **labels)} {value!r}" for labels, value in samples)

    last, status = last or {}, status or {}
    gauge("stare_step", "Optimizer steps done", [({}, float(v))] if (v := _number(status.get("step"))) is not None else [])
    gauge("stare_weight_version", "Published weight version",
          [({}, float(v))] if (v := _number(status.get("weight_version"))) is not None else [])
    for name, (key, help_text) in _STEP_GAUGES.items():
        value = _number(last.get(key))
        gauge(name, help_text, [({}, value)] if value is not None else [])
    depths = status.get("queue_depths") or {}
    gauge("stare_queue_depth", "Entries published and not yet acknowledged, per stream",
          [({"queue": q}, float(d)) for q, d in sorted(depths.items()) if _number(d) is not None])
    staleness = status.get("staleness") or {}
    gauge("stare_staleness", "Trajectories of the last step by weight-version lag",
          [({"lag": str(k)}, float(v)) for k, v in sorted((staleness.get("counts") or {}).items()) if _number(v) is not None])
    gauge("stare_paused", "1 while a pause is requested", [({}, float(paused))])
    gauge("stare_role_up", "1 while the role's heartbeat is fresh",
          [({"role": r.role, "name": r.name}, float(r.alive)) for r in roles])
    return "\n".join(lines) + "\n"
