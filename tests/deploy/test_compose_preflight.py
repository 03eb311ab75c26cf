"""scripts/compose_preflight.py, the check a reader runs before `docker compose up` (docs/deploy.md):
a published port another process holds is named with its holder and the variable that moves it,
before any container exists; it needs python3 and Docker, not stare. Docker does not run here: a
stand-in `docker` on PATH answers `compose config` with the repository's compose file as Compose v2
would resolve it (the variables interpolated, the profile's services only)."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys

import yaml
from deploy_helpers import REPO
from test_compose import load_compose, services_of

from stare.runtime.net import COMPOSE_PORT_VARIABLES

SCRIPT = REPO / "scripts" / "compose_preflight.py"


def _stand_in_docker(tmp_path, config: dict | None, running: list[str] = ()) -> dict[str, str]:
    """PATH with a `docker` whose `compose ... config` prints `config` (None: fails like Compose)."""
    listed = "\n".join(running)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f"""#!{sys.executable}
import sys
if "config" in sys.argv:
    if {config is None!r}:
        print("service \\"control-cpu\\" refers to undefined secret stare_api_token", file=sys.stderr)
        sys.exit(15)
    print({json.dumps(config or {})!r})
elif "ps" in sys.argv:
    print({listed!r})
""")
    docker.chmod(docker.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def _resolved(profile: str, env: dict[str, str], secrets_dir) -> dict:
    """What `docker compose --profile PROFILE config --format json` gives, its secret files in `secrets_dir`."""
    doc = load_compose(env)
    secrets = {}
    for name, s in doc.get("secrets", {}).items():
        made = secrets_dir / os.path.basename(s["file"])
        made.write_text("0" * 64)
        secrets[name] = {"file": str(made)}
    return {"services": services_of(doc, profile), "secrets": secrets}


def _run(env: dict[str, str]) -> subprocess.CompletedProcess:
    # -S: no site-packages, so stare cannot be imported: the script works on a host with Docker only
    return subprocess.run(
        [sys.executable, "-S", str(SCRIPT), "--profile", "cpu"], capture_output=True, text=True, env=env, timeout=60
    )


def test_a_held_control_port_stops_it_naming_the_holder(tmp_path):
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen(1)
        port = held.getsockname()[1]
        config = _resolved("cpu", {"STARE_CONTROL_PORT": str(port)}, tmp_path)
        done = _run(_stand_in_docker(tmp_path, config))
    assert done.returncode == 2, done.stderr
    assert f"control-cpu: 0.0.0.0:{port} is in use by pid {os.getpid()} (" in done.stderr
    assert f"(STARE_CONTROL_PORT={port + 1})" in done.stderr and "nothing was started" in done.stderr


def test_free_ports_pass(tmp_path):
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    free = port.getsockname()[1]
    port.close()
    done = _run(_stand_in_docker(tmp_path, _resolved("cpu", {"STARE_CONTROL_PORT": str(free)}, tmp_path)))
    assert done.returncode == 0, done.stderr
    assert "1 published port(s) free, every secret file present" in done.stderr


def test_a_running_deployment_is_not_its_own_clash(tmp_path):
    with socket.socket() as held:  # as docker-proxy holds the port of the running control-cpu
        held.bind(("0.0.0.0", 0))
        held.listen(1)
        config = _resolved("cpu", {"STARE_CONTROL_PORT": str(held.getsockname()[1])}, tmp_path)
        done = _run(_stand_in_docker(tmp_path, config, running=["redis", "control-cpu"]))
    assert done.returncode == 0, done.stderr


def test_compose_failing_is_reported_with_its_message(tmp_path):
    done = _run(_stand_in_docker(tmp_path, None))
    assert done.returncode == 2
    assert (
        '`docker compose --profile cpu config` failed: service "control-cpu" refers to undefined secret' in done.stderr
    )


def test_each_published_port_moves_with_the_variable_the_preflight_names():
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    published = {name: s["ports"] for name, s in services.items() if s.get("ports")}
    published |= {"control": ["${STARE_CONTROL_PORT:-8321}:8321"], "control-cpu": ["${STARE_CONTROL_PORT:-8321}:8321"]}
    for name, ports in published.items():
        (spec,) = ports
        assert re.search(rf"\$\{{{COMPOSE_PORT_VARIABLES[name]}:-\d+\}}:", spec), f"{name}: {spec}"
    x_control = yaml.safe_load((REPO / "docker-compose.yml").read_text())["x-control"]
    assert x_control["ports"] == ["${STARE_CONTROL_PORT:-8321}:8321"]


def test_the_readme_names_the_variable_of_the_control_port():
    text = (REPO / "README.md").read_text()
    assert "8321" in text and "STARE_CONTROL_PORT" in text


def test_a_missing_secret_is_named_with_the_script_that_makes_it(tmp_path):
    config = _resolved("cpu", {"STARE_CONTROL_PORT": "0"}, tmp_path)
    (tmp_path / "redis-password").unlink()
    done = _run(_stand_in_docker(tmp_path, config))
    assert done.returncode == 2
    assert "redis-password does not exist; run scripts/make_secrets.sh" in done.stderr
