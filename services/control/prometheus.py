"""The run's Prometheus metrics, built with prometheus-client from the RunState at each scrape.

`registry_for(state, run_id)` is one `CollectorRegistry` per run state (never the global one) with
one collector, `RunStateCollector`, which reads the state when scraped:

* gauges of the last step (entropy, target, band, gate, W, M, reward, length, step time, tokens/s,
  staleness, the step-time breakdown), of the run status (step, weight version, queue depths,
  dead letters, staleness counts, paused) and of role liveness (up, heartbeat age);
* histograms of every step's time (`time_step_s`) and weight-sync time (`time_publish_s`) and the
  counter of redeliveries, accumulated over the metrics history: each scrape reads only the entries
  appended since the last one, so a control-plane replica that starts late still counts the whole
  history Redis keeps (entries trimmed before it first scraped are not counted);
* the last held-out accuracy seen in the history (`eval_greedy_accuracy`, logged on eval steps).

Every sample carries `run_id`. The names of the hand-written exposition this replaced are kept
(`LEGACY_NAMES`) so dashboards keep working; docs/observability.md lists every metric.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.control.schemas import sanitized_status

# metric name -> (metrics.jsonl key, help)
STEP_GAUGES = {
    "stare_entropy": ("entropy", "Batch-mean token entropy of the last step (nats)"),
    "stare_entropy_target": ("target", "Entropy target of the last step"),
    "stare_entropy_band_low": ("band_low", "Lower edge of the entropy band"),
    "stare_entropy_band_high": ("band_high", "Upper edge of the entropy band"),
    "stare_gate": ("gate", "1 while STARE reweights (entropy under target)"),
    "stare_w": ("w", "W, the weight on high-surprisal positive-advantage tokens"),
    "stare_m": ("m", "M, the weight on high-surprisal negative-advantage tokens"),
    "stare_reward_mean": ("reward_mean", "Mean reward of the last step's trajectories"),
    "stare_accuracy": ("accuracy", "Share of the last step's trajectories with reward >= 1"),
    "stare_response_length_mean": ("response_length_mean", "Mean response length (tokens)"),
    "stare_step_time_seconds": ("time_step_s", "Wall time of the last step"),
    "stare_tokens_per_second": ("tokens_per_s", "Response tokens per second of the last step"),
    "stare_staleness_max": ("staleness_max", "Largest weight-version lag trained on in the last step"),
    "stare_staleness_mean": ("staleness_mean", "Mean weight-version lag trained on in the last step"),
    "stare_nonfinite_steps": ("nonfinite_steps", "Steps so far whose loss or gradient norm was NaN or infinite"),
    "stare_clip_fraction_low": (
        "clip_fraction_low",
        "Share of the last step's tokens held by the lower ratio clip (A < 0, r < 1 - eps_low), over its updates",
    ),
    "stare_clip_fraction_high": (
        "clip_fraction_high",
        "Share of the last step's tokens held by the upper ratio clip (A > 0, r > 1 + eps_high), over its updates",
    ),
    "stare_approx_kl": ("approx_kl", "k3 estimate of KL(pi_old || pi_theta) over the last step's updates (nats)"),
    "stare_rollout_mismatch_k1": (
        "rollout_mismatch_k1",
        "k1 estimate of KL(rollout || learner) over the last step's loss tokens (nats; may be negative)",
    ),
    "stare_rollout_mismatch_k3": (
        "rollout_mismatch_k3",
        "k3 estimate of KL(rollout || learner) over the last step's loss tokens (nats)",
    ),
    "stare_rollout_masked_fraction": (
        "rollout_masked_fraction",
        "Share of the last step's loss tokens dropped by the rollout-correction mask",
    ),
    "stare_rollout_truncated_fraction": (
        "rollout_truncated_fraction",
        "Share of the last step's loss tokens whose IS weight was truncated at the cap",
    ),
}
# phase label of stare_step_phase_seconds -> metrics.jsonl key. wait_data: sampling and scoring
# (`stare train`) or waiting for scored groups (`stare learner`); publish: the weight sync.
STEP_PHASES = {
    "wait_data": "time_wait_data_s",
    "plan": "time_plan_s",
    "learn": "time_learn_s",
    "publish": "time_publish_s",
}
STEP_TIME_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, math.inf)
SYNC_TIME_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, math.inf)
# the names the hand-written exposition exported (kept: dashboards query them)
LEGACY_NAMES = (
    "stare_step",
    "stare_weight_version",
    "stare_entropy",
    "stare_entropy_target",
    "stare_entropy_band_low",
    "stare_entropy_band_high",
    "stare_gate",
    "stare_w",
    "stare_m",
    "stare_reward_mean",
    "stare_response_length_mean",
    "stare_step_time_seconds",
    "stare_tokens_per_second",
    "stare_staleness_max",
    "stare_queue_depth",
    "stare_staleness",
    "stare_paused",
    "stare_role_up",
)
_PAGE = 500  # metrics entries read per round trip while catching up


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, (int, float)) else None


def _gauge(name: str, help_text: str, run_id: str, samples: Iterable[tuple[dict[str, str], Any]]) -> Metric | None:
    """A gauge family of the samples whose value is a number (None: no sample, no family)."""
    rows = [(labels, v) for labels, value in samples if (v := _number(value)) is not None]
    if not rows:
        return None
    family = GaugeMetricFamily(name, help_text, labels=["run_id", *rows[0][0]])
    for labels, value in rows:
        family.add_metric([run_id, *labels.values()], value)
    return family


def state_families(
    run_id: str, last: dict[str, Any] | None, status: dict[str, Any] | None, roles: list[Any], paused: bool
) -> list[Metric]:
    """The gauges of one snapshot of the run state (pure: state in, metric families out)."""
    last, status = last or {}, status or {}
    out = [
        _gauge("stare_step", "Optimizer steps done", run_id, [({}, status.get("step"))]),
        _gauge("stare_weight_version", "Published weight version", run_id, [({}, status.get("weight_version"))]),
    ]
    out += [_gauge(name, help_text, run_id, [({}, last.get(key))]) for name, (key, help_text) in STEP_GAUGES.items()]
    out += [
        _gauge(
            "stare_step_phase_seconds",
            "Wall time of the last step by phase (wait_data, plan, learn, publish)",
            run_id,
            [({"phase": p}, last.get(k)) for p, k in STEP_PHASES.items()],
        ),
        _gauge(
            "stare_queue_depth",
            "Entries published and not yet acknowledged, per stream",
            run_id,
            [({"queue": q}, d) for q, d in sorted((status.get("queue_depths") or {}).items())],
        ),
        _gauge(
            "stare_dead_letters",
            "Entries parked in the stream's dead-letter stream (failed validation, "
            "trimmed before an ack, or delivered too often)",
            run_id,
            [({"stream": s}, n) for s, n in sorted((status.get("dead_letters") or {}).items())],
        ),
        _gauge(
            "stare_staleness",
            "Trajectories of the last step by weight-version lag",
            run_id,
            [({"lag": str(k)}, v) for k, v in sorted(((status.get("staleness") or {}).get("counts") or {}).items())],
        ),
        _gauge("stare_paused", "1 while a pause is requested", run_id, [({}, paused)]),
        _gauge(
            "stare_role_up",
            "1 while the role's heartbeat is fresh",
            run_id,
            [({"role": r.role, "name": r.name}, r.alive) for r in roles],
        ),
        _gauge(
            "stare_role_heartbeat_age_seconds",
            "Seconds since the role's last heartbeat",
            run_id,
            [({"role": r.role, "name": r.name}, r.age_s) for r in roles],
        ),
    ]
    redelivered = [(r, _number(r.info.get("redelivered"))) for r in roles]
    if any(n is not None for _, n in redelivered):
        counter = CounterMetricFamily(
            "stare_redeliveries",
            "Stream entries a role took over from a dead consumer (XAUTOCLAIM) since the role started",
            labels=["run_id", "role", "name"],
        )
        for r, n in redelivered:
            if n is not None:
                counter.add_metric([run_id, r.role, r.name], n)
        out.append(counter)
    return [f for f in out if f is not None]


class _History:
    """What the collector accumulates over the metrics history."""

    def __init__(self, run_id: str):
        self.cursor = 0  # the absolute index of the next entry to read
        self.last: dict[str, Any] | None = None
        self.eval_accuracy: tuple[int, float] | None = None  # (step, greedy accuracy)
        self.histograms = (
            Histogram(
                "stare_step_duration_seconds",
                "Wall time of each optimizer step",
                ["run_id"],
                registry=None,
                buckets=STEP_TIME_BUCKETS,
            ),
            Histogram(
                "stare_weight_sync_duration_seconds",
                "Wall time of each weight publish (broadcast or filesystem) after a step",
                ["run_id"],
                registry=None,
                buckets=SYNC_TIME_BUCKETS,
            ),
        )
        self.step_time, self.sync_time = (h.labels(run_id) for h in self.histograms)

    def add(self, entry: dict[str, Any]) -> None:
        self.last = entry
        if (t := _number(entry.get("time_step_s"))) is not None and math.isfinite(t):
            self.step_time.observe(t)
        if (t := _number(entry.get("time_publish_s"))) is not None and math.isfinite(t):
            self.sync_time.observe(t)
        if (acc := _number(entry.get("eval_greedy_accuracy"))) is not None:
            self.eval_accuracy = (int(entry.get("step", 0)), acc)


class RunStateCollector(Collector):
    """A prometheus-client collector over one RunState (thread-safe: scrapes may overlap)."""

    def __init__(self, state: Any, run_id: str):
        self.state, self.run_id = state, run_id
        self._history = _History(run_id)
        self._lock = threading.Lock()

    def _catch_up(self) -> _History:
        h = self._history
        page = self.state.metrics_page(h.cursor, _PAGE)
        if page.total < h.cursor:  # the history was cleared (a new run under this run id): start over
            h = self._history = _History(self.run_id)
            page = self.state.metrics_page(0, _PAGE)
        while True:
            for entry in page.items:
                h.add(entry)
            h.cursor = page.next
            if page.next >= page.total or not page.items:
                return h
            page = self.state.metrics_page(h.cursor, _PAGE)

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            h = self._catch_up()
            status, roles, paused = self.state.status(), self.state.roles(), self.state.paused()
            status = None if status is None else sanitized_status(status)  # a wrong-typed field is left out
            yield from state_families(self.run_id, h.last, status, roles, paused)
            if h.eval_accuracy is not None:
                yield _gauge(
                    "stare_eval_greedy_accuracy",
                    "Held-out greedy accuracy of the last evaluation",
                    self.run_id,
                    [({}, h.eval_accuracy[1])],
                )
                yield _gauge(
                    "stare_eval_step", "Step of the last held-out evaluation", self.run_id, [({}, h.eval_accuracy[0])]
                )
            for histogram in h.histograms:
                yield from histogram.collect()


def registry_for(state: Any, run_id: str) -> CollectorRegistry:
    """A registry of its own for one run state (no global registry: several apps may share a process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunStateCollector(state, run_id))
    return registry
