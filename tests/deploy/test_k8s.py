"""deploy/k8s without a cluster: the base and each overlay rendered (tests/deploy/kustomize_lite.py,
and checked against `kubectl kustomize` where kubectl exists), every rendered object validated
against the Kubernetes OpenAPI schemas (kubernetes-validate, strict: unknown fields fail), and
consistency with the code: probes on the paths and ports the roles serve, real `stare` command
lines, environment variables the code reads, configs that parse and address the Services, and
references (ConfigMaps, Secrets, claims, Service selectors and ports) that resolve. Not covered:
scheduling, storage provisioning and GPUs on a real cluster (none here; docs/deploy.md)."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from deploy_helpers import REPO, check_env_name, check_stare_argv, control_plane_status, role_health_path_served
from kustomize_lite import KustomizeError, render, strategic_merge

from stare.config import build_config, load_config

K8S = REPO / "deploy" / "k8s"
TARGETS = ["base", "overlays/gpu", "overlays/cpu-dev"]
KUBE_VERSIONS = ["1.30", "1.37"]  # the oldest still-supported minor we target and kubernetes-validate's newest
WORKLOADS = {"Deployment", "StatefulSet", "Job"}
ROLE_KINDS = {"Deployment", "Job"}  # the stare roles: the learner is a Job, the others Deployments
ROLE_PORTS = {"control": 8321}


@pytest.fixture(scope="module")
def k8s_tree(tmp_path_factory) -> Path:
    """A copy of deploy/k8s (and deploy/monitoring, which the base includes) with the API token file
    a user creates before `kubectl apply -k`."""
    tree = tmp_path_factory.mktemp("deploy") / "k8s"
    shutil.copytree(K8S, tree)
    shutil.copytree(REPO / "deploy" / "monitoring", tree.parent / "monitoring")
    (tree / "base" / "secrets" / "api-token").write_text("test-token-not-secret")
    (tree / "base" / "secrets" / "redis-password").write_text("test-password-not-secret")
    (tree / "base" / "secrets" / "api-read-token").write_text("test-read-token-not-secret")
    return tree


@pytest.fixture(scope="module")
def rendered(k8s_tree) -> dict[str, list[dict]]:
    return {t: render(k8s_tree / t) for t in TARGETS}


def objects(rendered, target, kind=None):
    return [o for o in rendered[target] if kind is None or o["kind"] == kind]


def named(rendered, target, kind, name):
    (obj,) = [o for o in objects(rendered, target, kind) if o["metadata"]["name"] == name]
    return obj


def containers(obj):
    return obj["spec"]["template"]["spec"]["containers"]


def stare_containers(rendered, target):
    """(workload, container) for every container that runs a stare role."""
    return [
        (w, c)
        for w in objects(rendered, target)
        if w["kind"] in WORKLOADS
        for c in containers(w)
        if c["image"].split(":")[0].split("/")[-1].startswith("stare-")
    ]


def validation_error(obj, version) -> str | None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as err:
        return str(err)
    return None


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_every_rendered_object_is_valid_kubernetes(rendered, target, version):
    assert len(rendered[target]) == 15  # + the stare-redis Secret and NetworkPolicy
    errors = {f"{o['kind']}/{o['metadata']['name']}": validation_error(o, version) for o in rendered[target]}
    assert {k: e for k, e in errors.items() if e} == {}


@pytest.mark.parametrize(
    "breakage",
    [
        lambda d: containers(d)[0].update(livenessProbes={}),
        lambda d: containers(d)[0]["resources"]["limits"].update(memory={"gi": 4}),
        lambda d: d["spec"].update(replicas="two"),
        lambda d: containers(d)[0]["ports"][0].update(containerPort="http"),
    ],
    ids=["unknown-field", "quantity-not-a-string", "replicas-not-an-int", "port-not-an-int"],
)
def test_a_broken_manifest_fails_validation(rendered, breakage):
    deployment = copy.deepcopy(named(rendered, "base", "Deployment", "stare-control"))
    assert validation_error(deployment, "1.30") is None
    breakage(deployment)
    assert validation_error(deployment, "1.30") is not None


@pytest.mark.parametrize("target", TARGETS)
def test_our_renderer_matches_kubectl_kustomize(k8s_tree, rendered, target):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: kustomize_lite's output is not cross-checked")
    out = subprocess.run([kubectl, "kustomize", str(k8s_tree / target)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    theirs = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(out.stdout)}
    ours = {(o["kind"], o["metadata"]["name"]): o for o in rendered[target]}
    assert ours == theirs


def test_renderer_refuses_what_it_does_not_cover(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: []\nnamePrefix: x-\n")
    with pytest.raises(KustomizeError, match="namePrefix"):
        render(tmp_path)


def test_strategic_merge_of_the_cases_we_use():
    base = {
        "containers": [
            {"name": "a", "image": "x", "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": 1}}},
            {"name": "b", "image": "y"},
        ],
        "tolerations": [{"key": "k"}],
    }
    patch = {
        "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": None}}}],
        "tolerations": [{"key": "z"}],
    }
    assert strategic_merge(base, patch) == {
        "containers": [{"name": "a", "image": "x", "resources": {"limits": {"cpu": "1"}}}, {"name": "b", "image": "y"}],
        "tolerations": [{"key": "z"}],  # no merge key: replaced
    }


def test_the_api_token_and_redis_password_are_not_in_git():
    out = subprocess.run(["git", "ls-files", "deploy/k8s/base/secrets"], cwd=REPO, capture_output=True, text=True)
    assert out.stdout.split() == ["deploy/k8s/base/secrets/.gitignore"]


@pytest.mark.parametrize("target", TARGETS)
def test_redis_is_closed_to_everything_but_the_runs_pods(rendered, target):
    redis = containers(named(rendered, target, "StatefulSet", "stare-redis"))[0]
    args = redis["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    secret_of = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in redis["env"]}
    assert set(secret_of) == {"REDIS_PASSWORD", "REDISCLI_AUTH"}
    secret = next(
        o for o in rendered[target] if o["kind"] == "Secret" and o["metadata"]["name"].startswith("stare-redis")
    )
    assert set(secret_of.values()) == {secret["metadata"]["name"]}
    for pod_labels, c in (
        (o["spec"]["template"]["metadata"]["labels"], c)
        for o in rendered[target]
        if o["kind"] in ROLE_KINDS
        for c in containers(o)
    ):
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        (mount,) = [m["mountPath"] for m in c["volumeMounts"] if m["name"] == "redis-password"]
        assert env["STARE_REDIS_PASSWORD_FILE"] == f"{mount}/password", pod_labels
    policy = named(rendered, target, "NetworkPolicy", "stare-redis")
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "stare-redis"}
    (rule,) = policy["spec"]["ingress"]
    (allowed,) = rule["from"][0]["podSelector"]["matchExpressions"]
    assert rule["from"][1]["podSelector"]["matchLabels"] == {"ray.io/cluster": "stare"}  # deploy/ray's cluster
    role_pods = {
        o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
        for o in rendered[target]
        if o["kind"] in ROLE_KINDS
    }
    assert set(allowed["values"]) == role_pods and rule["ports"] == [{"protocol": "TCP", "port": 6379}]


@pytest.mark.parametrize("target", TARGETS)
def test_every_role_and_redis_is_deployed(rendered, target):
    roles = {c["args"][0] for _, c in stare_containers(rendered, target)}
    assert roles == {"control", "learner", "rollout", "reward"}
    redis = named(rendered, target, "StatefulSet", "stare-redis")
    assert redis["spec"]["volumeClaimTemplates"][0]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "--appendonly" in containers(redis)[0]["args"]
    learner = named(rendered, target, "Job", "stare-learner")["spec"]
    assert learner["parallelism"] == learner["completions"] == 1


@pytest.mark.parametrize("target", TARGETS)
def test_command_lines_are_real_stare_commands(rendered, target):
    for w, c in stare_containers(rendered, target):
        check_stare_argv(c["args"], f"{target}: {w['metadata']['name']}")


def _env_names():
    docs = [d for p in K8S.rglob("*.yaml") for d in yaml.safe_load_all(p.read_text()) if d and "spec" in d]
    names = set()
    for d in docs:
        pod = d["spec"].get("template", {}).get("spec", {})
        names |= {
            e["name"]
            for c in pod.get("containers", [])
            for e in c.get("env", [])
            # redis' own are redis' business; a patch's container (no image) patches a stare one
            if c.get("image", "stare-").split(":")[0].split("/")[-1].startswith("stare-")
        }
    return sorted(names)


@pytest.mark.parametrize("name", _env_names())
def test_environment_variable_is_read_by_the_code(name):
    check_env_name(name, "deploy/k8s")


@pytest.mark.parametrize("target", TARGETS)
def test_probes_hit_the_endpoints_the_code_serves(rendered, target):
    assert control_plane_status("/v1/health") == 200
    assert control_plane_status("/v1/ready") != 404
    assert role_health_path_served()
    for w, c in stare_containers(rendered, target):
        role = c["args"][0]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        expected = (
            {"livenessProbe": "/v1/health", "readinessProbe": "/v1/ready"}
            if role == "control"
            else {"livenessProbe": "/healthz", "readinessProbe": "/healthz"}
        )
        for probe, path in expected.items():
            get = c[probe]["httpGet"]
            assert get["path"] == path, (w["metadata"]["name"], probe)
            port = ports[get["port"]]
            if role == "control":
                assert port == int(c["args"][c["args"].index("--port") + 1]) == build_config({}).control_plane.port
            else:
                assert port == int(env["STARE_HEALTH_PORT"]), w["metadata"]["name"]


@pytest.mark.parametrize("target", TARGETS)
def test_resources_and_non_root(rendered, target):
    for w in objects(rendered, target):
        if w["kind"] not in WORKLOADS:
            continue
        pod = w["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
        for c in pod["containers"]:
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and {"cpu", "memory"} <= set(
                c["resources"]["limits"]
            )
            assert c["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize("target, gpus", [("base", 1), ("overlays/gpu", 1), ("overlays/cpu-dev", 0)])
def test_gpu_requests(rendered, target, gpus):
    ranks = _config(rendered, target).system.learner_ranks  # the learner: one GPU per rank
    for w, c in stare_containers(rendered, target):
        wants = {"learner": ranks * gpus, "rollout": gpus}.get(c["args"][0], 0)
        for section in ("requests", "limits"):
            assert c["resources"][section].get("nvidia.com/gpu", 0) == wants, (w["metadata"]["name"], section)
        image = c["image"].split(":")[0]
        assert image == ("stare-gpu" if wants else "stare-cpu"), (w["metadata"]["name"], image)


@pytest.mark.parametrize("target", ["base", "overlays/gpu"])
def test_pod_gpu_requests_follow_the_gpu_plan(rendered, target):
    """Kubernetes gets counts, not device ids: each learner pod requests the plan's learner GPUs and
    each rollout pod one GPU set of the plan (`stare up --print-plan`, stare.plan.gpu_map) for the
    config it mounts; the rollout Deployment's replicas are the plan's worker count (docs/deploy.md)."""
    from stare.plan.gpu_map import plan_gpus

    cfg = _config(rendered, target)
    plan = plan_gpus(
        8, tensor_parallel_size=cfg.rollout.engine.tensor_parallel_size, learner_ranks=cfg.system.learner_ranks
    )
    wants = {"learner": len(plan.learner), "rollout": len(plan.rollout[0])}
    for w, c in stare_containers(rendered, target):
        if c["args"][0] in wants:
            assert c["resources"]["limits"]["nvidia.com/gpu"] == wants[c["args"][0]], w["metadata"]["name"]


@pytest.mark.parametrize("target", TARGETS)
def test_references_resolve(rendered, target):
    names = {(o["kind"], o["metadata"]["name"]) for o in rendered[target]}
    for w in objects(rendered, target):
        if w["kind"] not in WORKLOADS:
            continue
        if w["kind"] == "Job":  # the Job controller sets the selector (a manual one needs manualSelector)
            assert "selector" not in w["spec"] and "manualSelector" not in w["spec"], w["metadata"]["name"]
        else:
            assert w["spec"]["selector"]["matchLabels"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
        for vol in w["spec"]["template"]["spec"].get("volumes", []):
            if "configMap" in vol:
                assert ("ConfigMap", vol["configMap"]["name"]) in names
            if "secret" in vol:
                assert ("Secret", vol["secret"]["secretName"]) in names
            if "persistentVolumeClaim" in vol:
                assert ("PersistentVolumeClaim", vol["persistentVolumeClaim"]["claimName"]) in names
        mounts = {m["name"] for c in containers(w) for m in c.get("volumeMounts", [])}
        declared = {v["name"] for v in w["spec"]["template"]["spec"].get("volumes", [])}
        declared |= {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        assert mounts <= declared, w["metadata"]["name"]
    for svc in objects(rendered, target, "Service"):
        matches = [
            w
            for w in objects(rendered, target)
            if w["kind"] in WORKLOADS
            and svc["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matches) == 1, svc["metadata"]["name"]
        port_names = {p["name"] for c in containers(matches[0]) for p in c["ports"]}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= port_names


def _config(rendered, target):
    (cm,) = [c for c in objects(rendered, target, "ConfigMap") if c["metadata"]["name"].startswith("stare-config-")]
    return build_config(yaml.safe_load(cm["data"]["stare.yaml"]))


@pytest.mark.parametrize("target, engine", [("base", "vllm"), ("overlays/gpu", "vllm"), ("overlays/cpu-dev", "hf")])
def test_config_parses_and_addresses_the_services(rendered, target, engine):
    cfg = _config(rendered, target)
    assert cfg.rollout.engine.name == engine
    redis_host, redis_port = re.match(r"rediss?://([^:/]+):(\d+)", cfg.system.redis_url).groups()
    redis = named(rendered, target, "Service", redis_host)
    assert int(redis_port) in {p["port"] for p in redis["spec"]["ports"]}
    learner = named(rendered, target, "Service", cfg.system.broadcast_host)
    assert [p["port"] for p in learner["spec"]["ports"]] == [cfg.system.broadcast_port]
    assert cfg.control_plane.token_file == Path("/run/secrets/stare_api_token")
    control = named(rendered, target, "Deployment", "stare-control")
    items = next(v for v in control["spec"]["template"]["spec"]["volumes"] if v["name"] == "api-token")["secret"][
        "items"
    ]
    mount = next(m for m in containers(control)[0]["volumeMounts"] if m["name"] == "api-token")
    paths = {i["key"]: Path(mount["mountPath"]) / i["path"] for i in items}
    assert paths == {"token": cfg.control_plane.token_file, "read-token": cfg.control_plane.read_token_file}
    assert str(cfg.run.output_dir).startswith("/data") and str(cfg.system.weight_dir).startswith("/data")


@pytest.mark.parametrize(
    "k8s_config, compose_config",
    [
        ("base/config/stare.yaml", "configs/gpu-node.yaml"),
        ("overlays/cpu-dev/config/stare.yaml", "configs/compose-cpu.yaml"),
    ],
)
def test_k8s_configs_differ_from_the_compose_ones_only_in_addresses(k8s_config, compose_config):
    ours = load_config(K8S / k8s_config).model_dump()
    theirs = load_config(REPO / compose_config).model_dump()
    for cfg in (ours, theirs):
        cfg["system"].pop("redis_url"), cfg["system"].pop("broadcast_host")
        cfg["control_plane"].pop("trusted_hosts")  # compose gives its names on the command line
    assert ours == theirs


@pytest.mark.parametrize("target, namespace", [("overlays/gpu", "stare"), ("overlays/cpu-dev", "stare-dev")])
def test_control_plane_trusts_only_its_service_names_and_localhost(rendered, target, namespace):
    """control_plane.trusted_hosts: the Service's DNS names in the overlay's namespace and localhost (the
    probes send Host: localhost), never "*"."""
    config = next(o for o in objects(rendered, target, "ConfigMap") if "stare.yaml" in o.get("data", {}))
    hosts = build_config(yaml.safe_load(config["data"]["stare.yaml"])).control_plane.trusted_hosts
    service = named(rendered, target, "Service", "stare-control")["metadata"]
    assert service["namespace"] == namespace
    name = service["name"]
    assert sorted(hosts) == sorted(
        [
            name,
            f"{name}.{namespace}",
            f"{name}.{namespace}.svc",
            f"{name}.{namespace}.svc.cluster.local",
            "localhost",
            "127.0.0.1",
        ]
    )
    control = next(c for w, c in stare_containers(rendered, target) if c["args"][0] == "control")
    for probe in ("livenessProbe", "readinessProbe"):
        assert {"name": "Host", "value": "localhost"} in control[probe]["httpGet"]["httpHeaders"], probe


def test_gpu_overlay_lets_nccl_see_one_host_per_node(rendered):
    """Learner and rollout pods on one node: hostIPC, the node's /dev/shm (not a per-pod emptyDir),
    and NCCL_HOSTID = the node's name."""
    for kind, name in (("Job", "stare-learner"), ("Deployment", "stare-rollout")):
        pod = named(rendered, "overlays/gpu", kind, name)["spec"]["template"]["spec"]
        assert pod["hostIPC"] is True, name
        shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
        assert shm == {"name": "dshm", "hostPath": {"path": "/dev/shm", "type": "Directory"}}, name
        (container,) = [c for c in pod["containers"] if c["image"].startswith("stare-gpu")]
        env = {e["name"]: e for e in container["env"]}
        assert env["NCCL_HOSTID"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}, name
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"], name


@pytest.mark.parametrize("target", TARGETS)
def test_liveness_probes_are_derived_from_stall_s(rendered, target):
    """/healthz turns 503 only after system.stall_s without progress (RoleRuntime.busy keeps long
    work alive); the liveness probe then restarts within another stall_s: period x failureThreshold
    <= stall_s of the mounted config, and a probe's timeout is shorter than its period."""
    config = next(o for o in objects(rendered, target, "ConfigMap") if "stare.yaml" in o.get("data", {}))
    stall_s = build_config(yaml.safe_load(config["data"]["stare.yaml"])).system.stall_s
    for w, c in stare_containers(rendered, target):
        if c["args"][0] == "control":
            continue
        probe = c["livenessProbe"]
        assert probe["periodSeconds"] * probe.get("failureThreshold", 3) <= stall_s, w["metadata"]["name"]
        assert probe.get("timeoutSeconds", 1) < probe["periodSeconds"], w["metadata"]["name"]


@pytest.mark.parametrize("target", TARGETS)
def test_the_learner_is_a_job_that_restarts_only_on_failure(rendered, target):
    """A finished run stays finished, as under compose's `restart: on-failure` (docs/deploy.md): the
    learner is a Job whose pod restarts on a failure (backoffLimit times) and completes on exit 0; one
    pod at a time (a replacement only after the old pod terminated); no TTL deletes the finished
    Job's status (nor lets `kubectl apply -k` start the finished run's learner again)."""
    (learner,) = [w for w, c in stare_containers(rendered, target) if c["args"][0] == "learner"]
    assert (learner["apiVersion"], learner["kind"], learner["metadata"]["name"]) == ("batch/v1", "Job", "stare-learner")
    spec = learner["spec"]
    assert spec["template"]["spec"]["restartPolicy"] == "OnFailure"
    assert 1 <= spec["backoffLimit"] <= 10
    assert spec["podReplacementPolicy"] == "Failed"
    assert "ttlSecondsAfterFinished" not in spec and "activeDeadlineSeconds" not in spec


def _shipped_pod_owners():
    """(file, document) for every shipped manifest under deploy/ with a pod template, overlays' patches included."""
    return [
        (p.relative_to(REPO).as_posix(), d)
        for p in sorted((REPO / "deploy").rglob("*.yaml"))
        for d in yaml.safe_load_all(p.read_text())
        if isinstance(d, dict) and "template" in d.get("spec", {})
    ]


def test_no_shipped_manifest_restarts_the_learner_after_a_clean_exit():
    """Every manifest (base, overlay patch, any other) that runs or patches the learner's pod is a Job
    with restartPolicy OnFailure or Never: a Deployment's or StatefulSet's pods restart Always, so
    Kubernetes would start a finished run's learner again, and a patch of another kind fails to apply."""
    learners = [
        (f, d)
        for f, d in _shipped_pod_owners()
        if d["metadata"]["name"] == "stare-learner"
        or any(
            c.get("args", [None])[0] == "learner" for c in d["spec"]["template"].get("spec", {}).get("containers", [])
        )
    ]
    assert {f for f, _ in learners} >= {
        "deploy/k8s/base/learner.yaml",
        "deploy/k8s/overlays/gpu/gpu-nodes.yaml",
        "deploy/k8s/overlays/cpu-dev/cpu-resources.yaml",
    }
    for f, d in learners:
        assert (d["apiVersion"], d["kind"]) == ("batch/v1", "Job"), f
        assert d["spec"]["template"]["spec"].get("restartPolicy", "OnFailure") in {"OnFailure", "Never"}, f
