"""docker-compose.yml without Docker: valid under the Compose Specification's JSON schema (vendored
in tests/deploy/schemas/), and consistent with the code: every role in each profile, real `stare`
command lines, environment variables the code reads, ports equal to the config's, GPUs assigned
once each, mounted files that exist and configs that parse; the `monitoring` profile resolved as
`docker compose --profile ... config` would (Prometheus scraping the control plane, Grafana's
provisioning). Not covered: that images build and
containers start (no Docker engine here; docs/deploy.md)."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from deploy_helpers import REPO, check_env_name, check_stare_argv, control_plane_status, role_health_path_served

from stare.config import load_config

COMPOSE_FILE = REPO / "docker-compose.yml"
PROMETHEUS_YML = REPO / "deploy" / "monitoring" / "prometheus.yml"
DASHBOARDS = REPO / "deploy" / "monitoring" / "grafana" / "dashboards"
SCHEMA_FILE = Path(__file__).parent / "schemas" / "compose-spec.json"
SCHEMA_SHA256 = "d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64"  # see schemas/README.md
PROFILES = ["gpu", "cpu"]
ROLES = ["control", "learner", "rollout", "reward"]
CONFIG_TARGET = "/etc/stare/stare.yaml"


def interpolate(value, env: dict[str, str]):
    """Compose's variable interpolation for what we use: ${VAR}, ${VAR:-default}, $$."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, default = m.group(1), m.group(3)
        if env.get(name):
            return env[name]
        assert default is not None, f"${{{name}}} has no default"
        return default

    return re.sub(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}", sub, value)


def compose_files() -> list[Path]:
    """The files `docker compose` reads here: .env's COMPOSE_FILE (docker-compose.yml plus the
    generated GPU services, stare/app/launch/compose.py)."""
    env = dict(
        line.split("=", 1)
        for line in (REPO / ".env").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    return [REPO / f for f in env.get("COMPOSE_FILE", COMPOSE_FILE.name).split(":")]


def merge(base: dict, override: dict, where: str = "") -> dict:
    """Compose's merge of a later file into an earlier one, for what the generated file holds:
    mappings merge key by key, a later scalar wins. (Compose appends or dedups sequences by rules of
    their own: a sequence overriding an existing one is refused here rather than guessed.)"""
    out = dict(base)
    for key, value in override.items():
        if key in base and isinstance(value, dict) and isinstance(base[key], dict):
            out[key] = merge(base[key], value, f"{where}/{key}")
        else:
            assert not (key in base and isinstance(value, list)), f"{where}/{key}: sequence merge not emulated"
            out[key] = value
    return out


def load_compose(env: dict[str, str] | None = None) -> dict:
    doc: dict = {}
    for path in compose_files():
        doc = merge(doc, yaml.safe_load(path.read_text()))
    return interpolate(doc, env or {})


def schema_errors(doc: dict) -> list[str]:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def services_of(doc: dict, profile: str) -> dict[str, dict]:
    """The services `docker compose --profile PROFILE up` starts."""
    return {n: s for n, s in doc["services"].items() if not s.get("profiles") or profile in s["profiles"]}


def role_of(service: dict) -> str | None:
    command = service.get("command") or []
    return command[0] if command and command[0] in ROLES else None


def stare_services(doc: dict) -> list[tuple[str, dict]]:
    return [(n, s) for n, s in doc["services"].items() if role_of(s)]


def mounts(service: dict) -> list[dict]:
    """The service's volumes in Compose's long syntax (a short `SOURCE:TARGET[:MODE]` converted):
    type, source, target, read_only, volume.nocopy."""
    out = []
    for v in service.get("volumes") or []:
        if isinstance(v, dict):
            out.append({"read_only": False, **v, "volume": v.get("volume") or {}})
            continue
        source, target, *mode = v.split(":")
        modes = mode[0].split(",") if mode else []
        kind = "bind" if source.startswith((".", "/", "$")) else "volume"
        out.append(
            {
                "type": kind,
                "source": source,
                "target": target,
                "read_only": "ro" in modes,
                "volume": {"nocopy": True} if "nocopy" in modes else {},
            }
        )
    return out


def config_of(service: dict) -> Path:
    """The host file mounted at the config path the command reads."""
    command = service["command"]
    assert command[command.index("--config") + 1] == CONFIG_TARGET
    found = [m for m in mounts(service) if m["target"] == CONFIG_TARGET]
    assert len(found) == 1, f"one file must be mounted at {CONFIG_TARGET}, found {found}"
    assert found[0]["type"] == "bind" and found[0]["read_only"], found[0]
    return REPO / found[0]["source"]


def env_of(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    assert isinstance(env, dict), "use the mapping form of environment"
    return {k: str(v) for k, v in env.items()}


def test_vendored_schema_is_the_recorded_file():
    assert hashlib.sha256(SCHEMA_FILE.read_bytes()).hexdigest() == SCHEMA_SHA256


@pytest.mark.parametrize(
    "env",
    [{}, {"STARE_REWARD_REPLICAS": "4", "STARE_GPU_IMAGE": "reg.example/stare-gpu:1"}],
    ids=["defaults", "overridden"],
)
def test_compose_file_is_valid_under_the_compose_spec(env):
    assert schema_errors(load_compose(env)) == []


@pytest.mark.parametrize(
    "breakage, path",
    [
        (lambda d: d["services"]["learner"].update(gpus_please=True), "services/learner"),
        (lambda d: d["services"]["redis"]["healthcheck"].update(interval=5), "services/redis/healthcheck/interval"),
        (
            lambda d: d["services"]["learner"]["deploy"]["resources"]["reservations"]["devices"][0].update(
                capabilities="gpu"
            ),
            "services/learner/deploy/resources/reservations/devices/0/capabilities",
        ),
        (lambda d: d["volumes"].update({"bad name!": None}), "volumes"),
    ],
    ids=["unknown-key", "wrong-type", "capabilities-not-a-list", "bad-volume-name"],
)
def test_a_broken_compose_file_fails_the_schema(breakage, path):
    doc = copy.deepcopy(load_compose())
    breakage(doc)
    errors = schema_errors(doc)
    assert errors and any(e.startswith(path) for e in errors), errors


@pytest.mark.parametrize("profile", PROFILES)
def test_every_role_runs_in_each_profile(profile):
    services = services_of(load_compose(), profile)
    roles = {role_of(s) for s in services.values()} - {None}
    assert roles == set(ROLES)
    assert "redis" in services
    assert sum(role_of(s) == "learner" for s in services.values()) == 1, "exactly one learner"


@pytest.mark.parametrize("name", [n for n, _ in stare_services(load_compose())])
def test_command_is_a_real_stare_command_line(name):
    check_stare_argv(load_compose()["services"][name]["command"], f"service {name}")


def _env_names() -> list[str]:
    names = {k for _, s in stare_services(load_compose()) for k in env_of(s)}
    for dockerfile in (REPO / "deploy" / "docker").glob("Dockerfile.*"):
        for block in re.findall(r"^ENV ((?:.*\\\n)*.*)$", dockerfile.read_text(), re.M):
            names |= set(re.findall(r"([A-Z][A-Z0-9_]*)=", block))
    return sorted(
        names - {"PATH", "DEBIAN_FRONTEND", "PYTHONUNBUFFERED", "PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK"}
    )


@pytest.mark.parametrize("name", _env_names())
def test_environment_variable_is_read_by_the_code(name):
    check_env_name(name, "docker-compose.yml / deploy/docker")


@pytest.mark.parametrize("name", [n for n, _ in stare_services(load_compose())])
def test_mounted_config_exists_and_parses(name):
    service = load_compose()["services"][name]
    path = config_of(service)
    assert path.is_file(), path
    cfg = load_config(path)
    profile = service["profiles"][0]
    assert cfg.rollout.engine.name == {"gpu": "vllm", "cpu": "hf"}[profile]
    if profile == "cpu":
        assert cfg.model.path is None, "the cpu profile runs the bundled tiny model"
    else:
        assert str(cfg.model.path).startswith("/models/"), "GPU checkpoints come from the read-only /models mount"


@pytest.mark.parametrize("profile", PROFILES)
def test_one_config_per_profile_and_its_addresses_resolve(profile):
    doc = load_compose()
    services = services_of(doc, profile)
    configs = {config_of(s) for s in services.values() if role_of(s)}
    assert len(configs) == 1, f"every role of a profile reads the same config: {configs}"
    cfg = load_config(configs.pop())
    names = set(services) | {
        a
        for s in services.values()
        if isinstance(s.get("networks"), dict)
        for net in s["networks"].values()
        for a in (net or {}).get("aliases", [])
    }
    redis_host = re.match(r"rediss?://([^:/]+)", cfg.system.redis_url).group(1)
    assert redis_host in names and cfg.system.broadcast_host in names
    for s in services.values():
        if role_of(s) and "STARE_REDIS_URL" in env_of(s):
            assert env_of(s)["STARE_REDIS_URL"] == cfg.system.redis_url
    learner = next(s for s in services.values() if role_of(s) == "learner")
    assert learner["expose"] == [str(cfg.system.broadcast_port)]
    assert cfg.system.broadcast_port == 29650  # the SystemSection default the docs quote


@pytest.mark.parametrize("profile", PROFILES)
def test_ports_and_health_checks_match_the_code(profile):
    services = services_of(load_compose(), profile)
    control = next(s for s in services.values() if role_of(s) == "control")
    cfg = load_config(config_of(control))
    command = control["command"]
    port = int(command[command.index("--port") + 1])
    assert port == cfg.control_plane.port == 8321
    assert control["ports"] == [f"8321:{port}"]
    assert control["healthcheck"]["test"][-1] == f"http://127.0.0.1:{port}/v1/health"
    assert control_plane_status("/v1/health") == 200
    for name, s in services.items():
        if role_of(s) in ("learner", "rollout", "reward"):
            health_port = env_of(s)["STARE_HEALTH_PORT"]
            assert s["healthcheck"]["test"][-1] == f"http://127.0.0.1:{health_port}/healthz", name
    assert role_health_path_served(), "no role serves /healthz"


def test_every_gpu_is_reserved_by_one_service():
    doc = load_compose()
    seen: dict[str, str] = {}
    for name, s in services_of(doc, "gpu").items():
        devices = (((s.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices", [])
        if role_of(s) in ("learner", "rollout"):
            assert len(devices) == 1 and devices[0]["capabilities"] == ["gpu"], name
            for gpu in devices[0]["device_ids"]:
                assert gpu not in seen, f"GPU {gpu} reserved by {seen.get(gpu)} and {name}"
                seen[gpu] = name
        else:
            assert not devices, f"{name} needs no GPU"
    for name, s in services_of(doc, "cpu").items():
        assert "devices" not in str(s.get("deploy")), f"{name}: the cpu profile must run without GPUs"


@pytest.mark.parametrize("name", [n for n, _ in stare_services(load_compose())])
def test_roles_wait_for_healthy_dependencies(name):
    doc = load_compose()
    depends = doc["services"][name]["depends_on"]
    assert "redis" in depends
    for dep, spec in depends.items():
        assert spec == {"condition": "service_healthy"}, (name, dep)
        assert "healthcheck" in doc["services"][dep] or dep == "redis"
    assert doc["services"]["redis"]["healthcheck"]["test"][0] == "CMD-SHELL"
    assert "redis-cli ping" in doc["services"]["redis"]["healthcheck"]["test"][1]


def test_redis_keeps_its_streams_on_a_volume():
    redis = load_compose()["services"]["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert "redis-data:/data" in redis["volumes"]


@pytest.mark.parametrize("profile", PROFILES)
def test_api_tokens_come_from_the_secrets(profile):
    """The write token and the read token (reads need one: the published port answers any host that
    sends an accepted Host header), each a compose secret; Prometheus scrapes with the read token."""
    doc = load_compose()
    control = next(s for s in services_of(doc, profile).values() if role_of(s) == "control")
    assert sorted(control["secrets"]) == ["redis_password", "stare_api_read_token", "stare_api_token"]
    settings = load_config(config_of(control)).control_plane
    assert settings.token_file == Path("/run/secrets/stare_api_token")
    assert settings.read_token_file == Path("/run/secrets/stare_api_read_token")
    assert doc["services"]["prometheus"]["secrets"] == ["stare_api_read_token"]
    for secret in ("stare_api_token", "stare_api_read_token"):
        source = REPO / doc["secrets"][secret]["file"]
        assert source.parent.is_dir()
        assert not any(p.name != ".gitignore" for p in source.parent.iterdir() if _tracked(p)), "no token in git"


@pytest.mark.parametrize("profile", PROFILES)
def test_redis_needs_the_password_every_role_reads_and_only_control_is_reachable(profile):
    doc = load_compose()
    redis = doc["services"]["redis"]
    assert "requirepass" in " ".join(redis["entrypoint"]) and "/run/secrets/redis_password" in redis["entrypoint"][2]
    assert redis["secrets"] == ["redis_password"] and "ports" not in redis
    assert (REPO / doc["secrets"]["redis_password"]["file"]).parent == REPO / "deploy" / "secrets"  # git-ignored
    assert doc["networks"]["internal"] == {"internal": True}
    for name, s in services_of(doc, profile).items():
        nets = s.get("networks")
        assert "internal" in (nets or {}), name
        if role_of(s):
            assert env_of(s)["STARE_REDIS_PASSWORD_FILE"] == "/run/secrets/redis_password", name
            assert "redis_password" in s["secrets"], name
        if role_of(s) != "control":
            assert "ports" not in s and "public" not in (nets or {}), f"{name} must not be reachable from outside"


def _tracked(path: Path) -> bool:
    import subprocess

    out = subprocess.run(["git", "ls-files", "--error-unmatch", str(path)], cwd=REPO, capture_output=True)
    return out.returncode == 0


def test_learner_and_rollout_share_the_run_volume():
    doc = load_compose()
    for profile in PROFILES:
        for name, s in services_of(doc, profile).items():
            if role_of(s) in ("learner", "rollout"):
                assert any(m["source"] == "stare-data" and m["target"] == "/data" for m in mounts(s)), name


def _seconds(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", str(text))
    assert m, f"compose duration {text!r}"
    return float(m.group(1)) * {"ms": 1e-3, "s": 1.0, "m": 60.0}[m.group(2)]


@pytest.mark.parametrize("profile", PROFILES)
def test_health_checks_are_derived_from_stall_s(profile):
    """/healthz turns 503 only after system.stall_s without progress (RoleRuntime.busy keeps long
    work alive); the check then acts within another stall_s: interval x retries <= stall_s, and a
    check's timeout is shorter than its interval."""
    for name, s in services_of(load_compose(), profile).items():
        if role_of(s) in ("learner", "rollout", "reward"):
            cfg = load_config(config_of(s))
            check = s["healthcheck"]
            assert _seconds(check["interval"]) * check["retries"] <= cfg.system.stall_s, name
            assert _seconds(check["timeout"]) < _seconds(check["interval"]), name


# ---- the monitoring profile: Prometheus and Grafana (deploy/monitoring; docs/observability.md) ----


def enabled(doc: dict, profiles: list[str]) -> dict:
    """What `docker compose --profile P1 --profile P2 config` resolves: the enabled services only."""
    out = dict(doc)
    out["services"] = {
        n: s for n, s in doc["services"].items() if not s.get("profiles") or set(s["profiles"]) & set(profiles)
    }
    return out


@pytest.mark.parametrize("profiles", [["monitoring"], ["cpu", "monitoring"], ["gpu", "monitoring"]], ids="+".join)
def test_compose_monitoring_profile_config_is_valid(profiles):
    doc = enabled(load_compose(), profiles)
    assert schema_errors(doc) == []
    assert {"prometheus", "grafana"} <= set(doc["services"])
    for name, service in doc["services"].items():
        for dep in service.get("depends_on") or {}:
            assert dep in doc["services"], f"{name} depends on {dep}, not enabled with --profile {profiles}"
        for secret in service.get("secrets") or []:
            assert secret in doc["secrets"]
        for volume in mounts(service):
            source = volume["source"]
            if source.startswith("./"):
                assert name not in ("prometheus", "grafana") or (REPO / source).exists(), (name, source)
            else:
                assert source in doc["volumes"], (name, source)


@pytest.mark.parametrize("profile", ["gpu", "cpu"])
def test_prometheus_scrapes_the_control_plane_of_each_profile(profile):
    doc = load_compose()
    scrape = yaml.safe_load(PROMETHEUS_YML.read_text())["scrape_configs"]
    (job,) = scrape
    (target,) = job["static_configs"][0]["targets"]
    host, port = target.split(":")
    (control,) = [s for s in enabled(doc, [profile])["services"].values() if role_of(s) == "control"]
    assert host in control["networks"]["public"]["aliases"]
    assert doc["services"]["prometheus"]["networks"] == ["public"]  # it reaches the alias, never Redis
    command = control["command"]
    assert int(port) == int(command[command.index("--port") + 1])
    assert control_plane_status(job["metrics_path"]) == 200
    token_path = job["authorization"]["credentials_file"]
    assert token_path == f"/run/secrets/{doc['services']['prometheus']['secrets'][0]}"


def test_grafana_provisioning_points_at_prometheus_and_the_dashboard():
    doc = load_compose()
    grafana = doc["services"]["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}  # target -> source
    provisioning = REPO / mounts["/etc/grafana/provisioning"].removeprefix("./")
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    host, port = re.fullmatch(r"http://([\w-]+):(\d+)", source["url"]).groups()
    assert host == "prometheus" and doc["services"]["prometheus"]["ports"][0].endswith(f":{port}")
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "stare.yml").read_text())["providers"]
    assert REPO / mounts[provider["options"]["path"]].removeprefix("./") == DASHBOARDS
    assert (DASHBOARDS / "stare.json").is_file()
