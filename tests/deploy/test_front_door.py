"""`docker compose up` on the first try, read from the files without Docker: every mounted
secret is made by the documented command, CPU limits fit a 2-core host by default, stare's roles
restart on failure only (a finished run stays finished), each named volume is populated from the
image by one service, replicas get stable `{slot}` names; the GPU services share what NCCL needs
to see one host; the control plane answers only its own names. What a real engine
does with them: scripts/compose_e2e.sh (docs/deploy.md)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys

import pytest
import yaml
from deploy_helpers import REPO
from test_compose import config_of, load_compose, mounts, role_of, services_of

from services.control.security import trusted_hosts
from stare.config import ControlPlaneSection

PROFILES = ["gpu", "cpu"]
MAKE_SECRETS = "scripts/make_secrets.sh"
HOST_CORES = 2  # the smallest machine the defaults must start on (a 2-core laptop or CI runner)


def run_make_secrets(directory) -> str:
    return subprocess.run(
        ["sh", str(REPO / MAKE_SECRETS), str(directory)], capture_output=True, text=True, timeout=30, check=True
    ).stdout


def test_every_secret_compose_mounts_is_made_by_the_documented_command(tmp_path):
    doc = load_compose()
    files = {s["file"] for s in doc["secrets"].values()}
    assert {os.path.dirname(f) for f in files} == {"./deploy/secrets"}, files
    run_make_secrets(tmp_path)
    for f in files:
        made = tmp_path / os.path.basename(f)
        assert made.is_file(), f"{f} is mounted by docker-compose.yml but {MAKE_SECRETS} does not create it"
        assert re.fullmatch(r"[0-9a-f]{64}", made.read_text()), made
        assert stat.S_IMODE(made.stat().st_mode) == 0o444, made  # containers read it as other users


def test_the_k8s_secrets_are_made_by_the_same_command(tmp_path):
    kustomization = yaml.safe_load((REPO / "deploy/k8s/base/kustomization.yaml").read_text())
    files = {f.split("=", 1)[1] for g in kustomization["secretGenerator"] for f in g.get("files", [])}
    run_make_secrets(tmp_path / "secrets")
    assert {f"secrets/{p.name}" for p in (tmp_path / "secrets").iterdir()} >= files


def test_make_secrets_keeps_an_existing_secret(tmp_path):
    run_make_secrets(tmp_path)
    first = (tmp_path / "api-token").read_text()
    assert "kept" in run_make_secrets(tmp_path)
    assert (tmp_path / "api-token").read_text() == first


@pytest.mark.parametrize("path", ["README.md", "docs/deploy.md", "docker-compose.yml"])
def test_the_docs_create_secrets_with_the_script_before_the_first_up(path):
    text = (REPO / path).read_text()
    assert MAKE_SECRETS in text, f"{path} does not name {MAKE_SECRETS}"
    assert text.index(MAKE_SECRETS) < text.index("--profile cpu up"), f"{path}: the secrets come after `up`"
    assert not re.search(r"openssl rand[^\n]*deploy/(k8s/base/)?secrets", text), f"{path}: a second way to make them"


@pytest.mark.parametrize("profile", PROFILES)
def test_cpu_limits_fit_a_two_core_host_by_default(profile):
    for name, s in services_of(load_compose(), profile).items():
        resources = (s.get("deploy") or {}).get("resources") or {}
        for kind in ("limits", "reservations"):
            cpus = (resources.get(kind) or {}).get("cpus")
            assert cpus is None or float(cpus) <= HOST_CORES, f"{name}: {kind}.cpus {cpus} > {HOST_CORES} cores"


def test_the_reward_cpu_limit_is_a_variable():
    doc = load_compose({"STARE_REWARD_CPUS": "8"})
    assert doc["services"]["reward"]["deploy"]["resources"]["limits"]["cpus"] == "8"


@pytest.mark.parametrize("profile", PROFILES)
def test_stare_roles_restart_on_failure_only(profile):
    """A finished run exits 0; `unless-stopped`/`always` would start the learner again forever."""
    roles = {
        n: s for n, s in services_of(load_compose(), profile).items() if role_of(s) in ("learner", "rollout", "reward")
    }
    assert any(role_of(s) == "learner" for s in roles.values())
    for name, s in roles.items():
        assert s.get("restart") == "on-failure", f"{name}: restart {s.get('restart')!r}"


def _named_volume_mounts(services: dict[str, dict]) -> dict[str, list[tuple[str, bool]]]:
    out: dict[str, list[tuple[str, bool]]] = {}
    for name, s in services.items():
        for m in mounts(s):
            if m["type"] == "volume":
                out.setdefault(m["source"], []).append((name, bool(m["volume"].get("nocopy"))))
    return out


@pytest.mark.parametrize("profiles", [["gpu"], ["cpu"], ["cpu", "monitoring"], ["gpu", "monitoring"]], ids="+".join)
def test_each_named_volume_is_populated_by_one_service(profiles):
    """Docker copies the image's content at the mount point into a fresh volume when a container
    mounts it without `nocopy`; two containers doing that at once race (moby/moby#43068:
    `mkdir .../_data/weights: file exists`)."""
    doc = load_compose()
    services = {n: s for n, s in doc["services"].items() if not s.get("profiles") or set(s["profiles"]) & set(profiles)}
    for volume, users in _named_volume_mounts(services).items():
        populating = [n for n, nocopy in users if not nocopy]
        assert len(populating) <= 1, f"volume {volume}: populated by {populating} at once"


def test_the_run_volume_is_populated_by_the_learner():
    """The image's /data (owned by the stare user) reaches a fresh volume through the learner, the
    service that writes there; the others mount it `nocopy`."""
    for profile in PROFILES:
        services = services_of(load_compose(), profile)
        users = _named_volume_mounts(services)["stare-data"]
        assert [role_of(services[n]) for n, nocopy in users if not nocopy] == ["learner"], (profile, users)


@pytest.mark.parametrize(
    "service, slot_name",
    [("rollout-cpu", "rollout-cpu-{slot}"), ("reward-cpu", "reward-cpu-{slot}"), ("reward", "reward-{slot}")],
)
def test_replicated_workers_get_stable_slot_names(service, slot_name):
    s = load_compose()["services"][service]
    assert s["environment"]["STARE_WORKER_NAME"] == slot_name


def test_every_gpu_service_shares_the_host_ipc_and_one_nccl_host_id():
    """NCCL compares host hashes (hostname-based per container unless NCCL_HOSTID is set) and needs
    a shared /dev/shm for SHM/CUDA IPC: otherwise the weight sync goes over NET/Socket."""
    doc = load_compose()
    gpu = {n: s for n, s in services_of(doc, "gpu").items() if role_of(s) in ("learner", "rollout")}
    assert len(gpu) >= 2 and any(n.startswith("rollout-") for n in gpu)
    assert {s.get("ipc") for s in gpu.values()} == {"host"}
    assert len({s["environment"]["NCCL_HOSTID"] for s in gpu.values()}) == 1
    assert all(s["environment"]["NCCL_HOSTID"] for s in gpu.values())
    assert not any("shm_size" in s for s in gpu.values())  # ignored with the host's IPC namespace


def test_the_generated_gpu_services_share_it_for_any_gpu_count():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "stare.app.cli",
            "up",
            "--config",
            "configs/gpu-node.yaml",
            "--gpus",
            "8",
            "--print-compose",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    services = yaml.safe_load(out.stdout)["services"]
    gpu = {n: s for n, s in services.items() if n == "learner" or n.startswith("rollout-")}
    assert len(gpu) >= 4
    assert {s["ipc"] for s in gpu.values()} == {"host"}
    assert {s["environment"]["NCCL_HOSTID"] for s in gpu.values()} == {"${STARE_NCCL_HOSTID:-stare-node}"}
    assert {s["restart"] for s in gpu.values()} == {"on-failure"}
    nocopy = {n: [m["volume"].get("nocopy", False) for m in mounts(s) if m["type"] == "volume"] for n, s in gpu.items()}
    assert nocopy["learner"] == [False, False] and all(v == [True, True] for n, v in nocopy.items() if n != "learner")


def _control_hosts(service: dict) -> list[str]:
    command = service["command"]
    sets = [
        command[i + 1]
        for i, w in enumerate(command)
        if w == "--set" and command[i + 1].startswith("control_plane.trusted_hosts=")
    ]
    assert len(sets) == 1, command
    hosts = yaml.safe_load(sets[0].split("=", 1)[1])
    return trusted_hosts(ControlPlaneSection(trusted_hosts=hosts))


@pytest.mark.parametrize("service", ["control", "control-cpu"])
def test_the_control_plane_trusts_its_service_names_and_localhost_only(service):
    s = load_compose()["services"][service]
    hosts = _control_hosts(s)
    assert "*" not in hosts
    aliases = s["networks"]["public"]["aliases"]
    prometheus = yaml.safe_load((REPO / "deploy/monitoring/prometheus.yml").read_text())
    scraped = {
        t.split(":")[0] for c in prometheus["scrape_configs"] for sc in c["static_configs"] for t in sc["targets"]
    }
    health_host = re.search(r"//([^:/]+)", " ".join(s["healthcheck"]["test"])).group(1)
    assert set(hosts) == {*aliases, "control", "control-cpu", "localhost", "127.0.0.1"}
    assert scraped <= set(hosts) and health_host in hosts


def test_an_ingress_host_is_added_with_a_variable():
    s = load_compose({"STARE_TRUSTED_HOSTS": "stare.example.org, 10.0.0.5"})["services"]["control-cpu"]
    assert {"stare.example.org", "10.0.0.5"} <= set(_control_hosts(s))


def test_the_e2e_tiny_run_keeps_the_shipped_configs_meaning():
    """scripts/compose_e2e.sh shortens the run through a copy and a compose override, never by
    editing configs/compose-cpu.yaml: its sed patterns must match the shipped file's lines."""
    text = (REPO / "configs/compose-cpu.yaml").read_text()
    for key in ("steps", "checkpoint_every", "eval_every"):
        assert re.search(rf"^  {key}: ", text, re.M), key
    assert config_of(load_compose()["services"]["learner-cpu"]) == REPO / "configs/compose-cpu.yaml"
