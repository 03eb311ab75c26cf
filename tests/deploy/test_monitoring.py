"""Monitoring without a cluster: the Grafana dashboard queries only metrics the control plane
exports (its PromQL parsed for metric and label names, checked against a real /metrics scraped
after a step that logged every field); the issue's panels are there; the Kubernetes dashboard
ConfigMap is the same JSON, labelled for Grafana's sidecar, and the control pod is annotated for
scraping. The compose `monitoring` profile is checked in tests/deploy/test_compose.py.
Not covered: Prometheus and Grafana running (no Docker engine here)."""

from __future__ import annotations

import json
import re
from collections import defaultdict

import pytest
from deploy_helpers import REPO, control_plane_status
from kustomize_lite import render

DASHBOARD = REPO / "deploy" / "monitoring" / "grafana" / "dashboards" / "stare.json"
# the dashboard's panels (title -> a metric it must query)
REQUIRED_PANELS = {
    "Entropy, target and band": "stare_entropy_band_low",
    "Gate": "stare_gate",
    "W and M": "stare_m",
    "Reward": "stare_reward_mean",
    "Held-out accuracy": "stare_eval_greedy_accuracy",
    "Response length": "stare_response_length_mean",
    "Step-time breakdown": "stare_step_phase_seconds",
    "Tokens per second": "stare_tokens_per_second",
    "Staleness": "stare_staleness_max",
    "Queue depths": "stare_queue_depth",
    "Dead letters": "stare_dead_letters",
    "Weight-sync time": "stare_weight_sync_duration_seconds_bucket",
    "Role health": "stare_role_up",
}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless"}


def exported() -> dict[str, set[str]]:
    """Sample name -> label names on /metrics after a step that logged every field the collector reads."""
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from learner.algorithm.entropy_controller import EntropyController
    from services.control.app import create_app
    from services.control.prometheus import STEP_GAUGES, STEP_PHASES
    from stare.config import ControlPlaneSection
    from stare.config.algo import ControllerConfig
    from stare.runstate import MemoryRunState, RunSteering
    from stare.runstate.base import Heartbeat

    state = MemoryRunState("run")
    controller = EntropyController(ControllerConfig(target=0.3))
    control = RunSteering(state)
    control.start(controller)
    step = {key: 0.5 for key, _ in STEP_GAUGES.values()} | dict.fromkeys(STEP_PHASES.values(), 0.1)
    control.after_step(
        controller,
        {**step, "step": 1, "weight_version": 1, "eval_greedy_accuracy": 0.5},
        {"queue_depths": {"raw": 1}, "dead_letters": {"raw": 0}, "staleness": {"counts": {"0": 4}}},
    )
    state.beat(Heartbeat(role="rollout", name="rollout-0", pid=1, host="h", info={"redelivered": 2}))
    text = (
        TestClient(create_app(state, ControlPlaneSection(trusted_hosts=["testserver"]), "run", token="t"))
        .get("/metrics")
        .text
    )
    names: dict[str, set[str]] = defaultdict(set)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            names[s.name] |= set(s.labels)
    return dict(names)


def panels() -> list[dict]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names matched) of every selector in a PromQL expression; `by (...)`
    labels are attributed to every metric of the expression."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values out of the way
    grouping = {label.strip() for g in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr) for label in g.split(",")}
    out = []
    for m in re.finditer(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?(?!\s*\()", expr):
        name, matchers = m.group(1), m.group(2) or ""
        if name.startswith("stare_"):
            out.append(
                (name, set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers)) | grouping - {""})
            )
    return out


def test_selector_parsing_finds_names_and_labels():
    got = selectors('histogram_quantile(0.9, sum by (le, run_id) (rate(stare_x_bucket{run_id=~"a,b}"}[5m]))) + stare_y')
    assert got == [("stare_x_bucket", {"le", "run_id"}), ("stare_y", {"le", "run_id"})]


@pytest.mark.parametrize("panel", panels(), ids=lambda p: p["title"])
def test_every_metric_a_panel_queries_is_exported_with_its_labels(panel):
    names = exported()
    found = [(name, labels) for t in panel["targets"] for name, labels in selectors(t["expr"])]
    assert found, f"panel {panel['title']!r} queries no stare metric"
    for name, labels in found:
        assert name in names, f"panel {panel['title']!r} queries {name}, which /metrics does not export"
        assert labels <= names[name] | {"le"}, (panel["title"], name, labels - names[name])
    for t in panel["targets"]:
        legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")))
        assert legend <= set().union(*(names[n] for n, _ in selectors(t["expr"]))), (panel["title"], legend)


def test_the_issues_panels_are_on_the_dashboard():
    by_title = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in panels()}
    for title, metric in REQUIRED_PANELS.items():
        assert title in by_title and metric in by_title[title], title


def test_dashboard_ids_are_unique_and_the_run_variable_reads_an_exported_metric():
    doc = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) and doc["uid"] == "stare-run"
    run_var = next(v for v in doc["templating"]["list"] if v["name"] == "run_id")
    metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", run_var["definition"]).groups()
    assert label in exported()[metric]


def test_kubernetes_ships_the_dashboard_configmap_and_scrape_annotations(tmp_path):
    import shutil

    shutil.copytree(REPO / "deploy" / "k8s", tmp_path / "k8s")
    shutil.copytree(REPO / "deploy" / "monitoring", tmp_path / "monitoring")
    (tmp_path / "k8s" / "base" / "secrets" / "api-token").write_text("t")
    (tmp_path / "k8s" / "base" / "secrets" / "redis-password").write_text("p")
    (tmp_path / "k8s" / "base" / "secrets" / "api-read-token").write_text("r")
    for target in ("base", "overlays/gpu", "overlays/cpu-dev"):
        objs = render(tmp_path / "k8s" / target)
        (cm,) = [
            o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("stare-grafana-dashboard")
        ]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(cm["data"]["stare.json"]) == json.loads(DASHBOARD.read_text())
        (control,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "stare-control"]
        notes = control["spec"]["template"]["metadata"]["annotations"]
        ports = {p["containerPort"] for c in control["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        assert notes["prometheus.io/scrape"] == "true" and int(notes["prometheus.io/port"]) in ports
        assert control_plane_status(notes["prometheus.io/path"]) == 200
