"""deploy/ray/raycluster.yaml without a cluster: the KubeRay RayCluster checked structurally (its CRD
schema is not available offline) and every pod template inside it validated as a Kubernetes
PodTemplate (kubernetes-validate, strict). Not covered: the KubeRay operator and `stare launch
--ray` on it (docs/deploy.md)."""

from __future__ import annotations

import copy
import re

import kubernetes_validate
import pytest
import yaml
from deploy_helpers import REPO, check_env_name

RAY_FILE = REPO / "deploy" / "ray" / "raycluster.yaml"
RAY_VERSION = "2.60.0"  # deploy/docker/constraints-gpu.txt must install the same


def load() -> dict:
    return yaml.safe_load(RAY_FILE.read_text())


def structure_errors(cluster: dict) -> list[str]:
    """What KubeRay's CRD (ray.io/v1) requires of the fields we use, plus our own rules."""
    errors = []
    if cluster.get("apiVersion") != "ray.io/v1" or cluster.get("kind") != "RayCluster":
        errors.append("apiVersion/kind must be ray.io/v1 RayCluster")
    spec = cluster.get("spec", {})
    if set(spec) - {"rayVersion", "enableInTreeAutoscaling", "headGroupSpec", "workerGroupSpecs"}:
        errors.append(
            f"unknown spec fields {sorted(set(spec) - {'rayVersion', 'enableInTreeAutoscaling', 'headGroupSpec', 'workerGroupSpecs'})}"
        )
    head = spec.get("headGroupSpec", {})
    for field in ("rayStartParams", "template"):
        if field not in head:
            errors.append(f"headGroupSpec.{field} is required")
    names = [g.get("groupName") for g in spec.get("workerGroupSpecs", [])]
    if len(set(names)) != len(names) or not all(names):
        errors.append("worker groups need unique groupName")
    for g in spec.get("workerGroupSpecs", []):
        if not isinstance(g.get("replicas"), int) or not g.get("minReplicas", 0) <= g["replicas"] <= g.get(
            "maxReplicas", 2**31
        ):
            errors.append(f"group {g.get('groupName')}: need minReplicas <= replicas <= maxReplicas")
        if "template" not in g or "rayStartParams" not in g:
            errors.append(f"group {g.get('groupName')}: template and rayStartParams are required")
        if any(not isinstance(v, str) for v in g.get("rayStartParams", {}).values()):
            errors.append(f"group {g.get('groupName')}: rayStartParams values are strings")
    return errors


def templates(cluster: dict) -> list[tuple[str, dict]]:
    spec = cluster["spec"]
    return [("head", spec["headGroupSpec"]["template"])] + [
        (g["groupName"], g["template"]) for g in spec["workerGroupSpecs"]
    ]


def test_raycluster_structure():
    assert structure_errors(load()) == []


@pytest.mark.parametrize(
    "breakage",
    [
        lambda c: c["spec"]["workerGroupSpecs"][0].update(replicas=99),
        lambda c: c["spec"]["workerGroupSpecs"][1].update(groupName="gpu"),
        lambda c: c["spec"]["headGroupSpec"].pop("rayStartParams"),
        lambda c: c["spec"]["workerGroupSpecs"][1]["rayStartParams"].update({"num-gpus": 0}),
    ],
    ids=["replicas-above-max", "duplicate-group", "no-head-params", "param-not-a-string"],
)
def test_a_broken_raycluster_fails(breakage):
    cluster = copy.deepcopy(load())
    breakage(cluster)
    assert structure_errors(cluster)


@pytest.mark.parametrize("group", ["head", "gpu", "cpu"])
def test_pod_templates_are_valid_kubernetes(group):
    template = dict(templates(load()))[group]
    pod_template = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": f"ray-{group}"},
        "template": template,
    }
    kubernetes_validate.validate(pod_template, "1.30", strict=True)
    broken = copy.deepcopy(pod_template)
    broken["template"]["spec"]["containers"][0]["resourcez"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.30", strict=True)


def test_gpus_only_in_the_gpu_group_and_one_ray_version():
    cluster = load()
    assert cluster["spec"]["rayVersion"] == RAY_VERSION
    assert f"ray=={RAY_VERSION}" in (REPO / "deploy" / "docker" / "constraints-gpu.txt").read_text()
    for group, template in templates(cluster):
        (container,) = template["spec"]["containers"]
        gpus = container["resources"]["limits"].get("nvidia.com/gpu", 0)
        assert gpus == (1 if group == "gpu" else 0), group
        assert container["image"].startswith("stare-gpu:"), "every Ray node runs the image with Ray in it"
        assert template["spec"]["securityContext"]["runAsNonRoot"] is True
    head_params = cluster["spec"]["headGroupSpec"]["rayStartParams"]
    assert head_params["num-gpus"] == "0"


def test_environment_variables_are_read():
    names = {e["name"] for _, t in templates(load()) for c in t["spec"]["containers"] for e in c.get("env", [])}
    for name in sorted(names):
        check_env_name(name, "deploy/ray/raycluster.yaml")


def test_the_documented_configmap_is_the_one_mounted():
    text = RAY_FILE.read_text()
    created = re.search(r"create configmap (\S+)", text).group(1)
    for _, template in templates(load()):
        config = next(v for v in template["spec"]["volumes"] if v["name"] == "config")
        assert config["configMap"]["name"] == created
