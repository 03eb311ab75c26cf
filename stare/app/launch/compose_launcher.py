"""`stare up --target compose`: the roles as Docker Compose services of this machine
(docker-compose.yml, profile `gpu` on a node with GPUs, `cpu` without), a
stare.app.launch.base.Launcher like the other targets.

The services run with the config their profile mounts (configs/gpu-node.yaml or
configs/compose-cpu.yaml), so `--config` / `--set` do not apply here; a node other than the
shipped 4-GPU one first writes its GPU services with `stare up --print-compose` (compose.py).
Restarts are Docker's (`restart: on-failure`), so `supervise` only watches: it returns the
learner's exit code when its container exits, and 1 when a role's container is gone. Every
`docker` call has a time limit.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from stare.config import ConfigError, TrainConfig
from stare.runtime.net import compose_preflight

DOCKER_TIMEOUT_S = 120.0  # one `docker compose` call; `up -d` builds nothing (images are built beforehand)


class ComposeLauncher:
    def __init__(
        self,
        cfg: TrainConfig,
        *,
        compose_file: Path,
        profile: str,
        grace_s: float = 60.0,
        out: TextIO | None = None,
        docker: str = "docker",
    ):
        if shutil.which(docker) is None:
            raise ConfigError(
                f"--target compose needs the Docker CLI with Compose v2 ({docker!r} is not on PATH): "
                "install Docker Engine and the compose plugin, or use --target processes"
            )
        if not compose_file.is_file():
            raise ConfigError(
                f"--target compose: {compose_file} does not exist; run from the repository root or pass --compose-base"
            )
        self.cfg, self.profile, self.grace_s = cfg, profile, grace_s
        self.out = out or sys.stdout
        self.force_stop = False
        self.base = [docker, "compose", "--project-directory", str(compose_file.parent), "-f", str(compose_file)]
        gpus = compose_file.parent / "docker-compose.gpus.yml"
        if profile == "gpu" and gpus.is_file():
            self.base += ["-f", str(gpus)]
        self.base += ["--profile", profile]
        self.learner = "learner" if profile == "gpu" else "learner-cpu"

    def say(self, text: str, who: str = "compose") -> None:
        self.out.write(f"{who:>10} | {text.rstrip()}\n")
        self.out.flush()

    def _compose(self, *args: str, timeout: float = DOCKER_TIMEOUT_S) -> str:
        try:
            done = subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"`docker compose {' '.join(args)}` did not answer within {timeout:.0f} s") from None
        if done.returncode != 0:
            raise RuntimeError(
                f"`docker compose {' '.join(args)}` failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-2000:]}"
            )
        return done.stdout

    def preflight(self) -> None:
        """Refuse, naming the holder, a published port another process holds (or a missing secret)
        before `up` creates any container: compose would start some services and leave the rest
        "Created" (scripts/compose_preflight.py runs the same check for the documented commands)."""
        config = json.loads(self._compose("config", "--format", "json"))
        running = self._compose("ps", "--status", "running", "--services").split()
        problems = compose_preflight(config, running)
        if problems:
            raise ConfigError("--target compose: nothing started: " + "; ".join(problems))

    def start(self) -> None:
        self.preflight()
        self._compose("up", "-d")
        self.say(f"services of profile {self.profile} up (docker compose ps; logs: docker compose logs -f)")

    def states(self) -> dict[str, dict]:
        """service -> its container's state (`State`, `ExitCode`), from `docker compose ps -a`."""
        text = self._compose("ps", "-a", "--format", "json").strip()
        rows = json.loads(text) if text.startswith("[") else [json.loads(line) for line in text.splitlines() if line]
        return {row["Service"]: row for row in rows}

    def supervise(self, until: Callable[[], bool] = lambda: False, poll_s: float = 2.0) -> int:
        while True:
            if until():
                return 0
            learner = self.states().get(self.learner)
            if learner is None:
                self.say(f"the {self.learner} container is gone (removed by hand?)")
                return 1
            if learner.get("State") == "exited":
                code = int(learner.get("ExitCode", 1))
                self.say(f"{self.learner} exited with {code}")
                return code
            time.sleep(poll_s)

    def kill(self, name: str) -> None:
        self._compose("kill", name)

    def stop(self) -> None:
        """`docker compose stop`: SIGTERM to every service (the learner checkpoints), SIGKILL after grace_s."""
        grace = 1 if self.force_stop else int(self.grace_s)
        self._compose("stop", "--timeout", str(grace), timeout=DOCKER_TIMEOUT_S + grace)
        self.say("stopped (docker compose start resumes; docker compose down removes the containers)")
