"""The launch seam: every target is a `Launcher` (start, supervise, kill, stop), and the compose target
drives `docker compose` as documented. Docker cannot run on this machine kind, so the compose tests put
a stand-in `docker` on PATH that records its arguments and answers `ps` like Compose v2."""

import inspect
import json
import stat
from pathlib import Path

import pytest

from stare.app.launch.base import Launcher
from stare.app.launch.compose_launcher import ComposeLauncher
from stare.app.launch.processes import ProcessLauncher
from stare.app.launch.ray import RayLauncher
from stare.app.launch.run import run_until_done
from stare.config import ConfigError, build_config

PROTOCOL = {n for n, v in vars(Launcher).items() if inspect.isfunction(v) and not n.startswith("_")}


@pytest.mark.parametrize("cls", [ProcessLauncher, ComposeLauncher, RayLauncher])
def test_every_target_implements_the_launcher_protocol(cls):
    assert PROTOCOL == {"say", "start", "supervise", "kill", "stop"}
    missing = {name for name in PROTOCOL if not callable(getattr(cls, name, None))}
    assert not missing, f"{cls.__name__} lacks {missing}"


def _fake_docker(
    tmp_path: Path, learner_state: str, exit_code: int, running_polls: int, config: dict | None = None
) -> tuple[Path, Path]:
    """A `docker` that appends its argv (one JSON list a line) to calls.jsonl; `compose config` prints
    `config` (default: no service publishes a port), `compose ps --services` no running service, and
    `compose ps` reports the learner running for `running_polls` calls, then `learner_state` with
    `exit_code`."""
    log = tmp_path / "calls.jsonl"
    script = tmp_path / "bin" / "docker"
    script.parent.mkdir()
    script.write_text(f"""#!/usr/bin/env python3
import json, sys
from pathlib import Path
log = Path({str(log)!r})
with log.open("a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if "config" in sys.argv:
    print({json.dumps(config or {"services": {}})!r})
    sys.exit(0)
if "--services" in sys.argv:
    sys.exit(0)
if "ps" in sys.argv:
    polls = sum(1 for line in log.read_text().splitlines() if '"ps"' in line and '"--services"' not in line)
    state = "running" if polls <= {running_polls} else {learner_state!r}
    for service in ("redis", "learner-cpu", "rollout-cpu"):
        print(json.dumps({{"Service": service, "State": state if service == "learner-cpu" else "running",
                          "ExitCode": {exit_code} if service == "learner-cpu" else 0}}))
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, log


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_compose_target_starts_watches_the_learner_and_stops(tmp_path, monkeypatch):
    docker, log = _fake_docker(tmp_path, "exited", 0, running_polls=2)
    compose = tmp_path / "docker-compose.yml"
    compose.write_text("services: {}\n")
    launcher = ComposeLauncher(build_config({}), compose_file=compose, profile="cpu", docker=str(docker), grace_s=7)
    code = run_until_done(_Quick(launcher))
    assert code == 0
    calls = _calls(log)
    verbs = [c[c.index("--profile") + 2] for c in calls]
    assert verbs[:3] == ["config", "ps", "up"] and calls[2][-1] == "-d"  # the preflight, then up
    assert verbs.count("ps") == 4  # the preflight's running services; then running, running, exited
    assert calls[-1][-3:] == ["stop", "--timeout", "7"]
    assert all(c[:2] == ["compose", "--project-directory"] and "cpu" in c for c in calls)


def test_the_compose_target_returns_the_learners_exit_code(tmp_path):
    docker, log = _fake_docker(tmp_path, "exited", 3, running_polls=0)
    compose = tmp_path / "docker-compose.yml"
    compose.write_text("services: {}\n")
    launcher = ComposeLauncher(build_config({}), compose_file=compose, profile="cpu", docker=str(docker))
    assert run_until_done(_Quick(launcher)) == 3


def test_the_compose_target_starts_nothing_when_a_published_port_is_held(tmp_path):
    """Compose creates every container, then a held port fails one service's start and leaves the
    others "Created": the launcher refuses before `up`, naming the process that holds the port."""
    import os
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        config = {
            "services": {
                "control-cpu": {
                    "ports": [{"published": str(port), "host_ip": "127.0.0.1", "target": 8321, "protocol": "tcp"}]
                }
            }
        }
        docker, log = _fake_docker(tmp_path, "running", 0, running_polls=0, config=config)
        compose = tmp_path / "docker-compose.yml"
        compose.write_text("services: {}\n")
        launcher = ComposeLauncher(build_config({}), compose_file=compose, profile="cpu", docker=str(docker))
        with pytest.raises(ConfigError) as err:
            launcher.start()
    assert f"control-cpu: 127.0.0.1:{port} is in use by pid {os.getpid()} (" in str(err.value)
    assert f"STARE_CONTROL_PORT={port + 1}" in str(err.value)
    assert "up" not in [c[c.index("--profile") + 2] for c in _calls(log)]


def test_the_compose_target_without_docker_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="needs the Docker CLI with Compose v2"):
        ComposeLauncher(build_config({}), compose_file=tmp_path / "docker-compose.yml", profile="cpu")


def test_the_compose_target_refuses_a_config_it_would_not_use(capsys):
    from stare.app.cli import main

    assert main(["up", "--target", "compose", "--set", "optim.lr=1e-5"]) == 2
    assert "--target compose runs the services with the config docker-compose.yml mounts" in capsys.readouterr().err


def test_launch_ray_is_the_old_spelling_of_up_target_ray():
    from stare.app.cli.parser import parse_args

    up = parse_args(["up", "--target", "ray", "--address", "auto", "--max-restarts", "2"])
    old = parse_args(["launch", "--ray", "--address", "auto", "--max-restarts", "2"])
    assert (up.address, up.max_restarts, up.start_timeout_s) == (old.address, old.max_restarts, old.start_timeout_s)


class _Quick:
    """The compose launcher with a short poll, so the test does not wait 2 s per `ps`."""

    def __init__(self, inner: ComposeLauncher):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def supervise(self, until=lambda: False, poll_s: float = 0.01) -> int:
        return self.inner.supervise(until, poll_s)
