"""The roles of one run as processes on this machine (`stare up`, the default target):

    redis-server (unless --redis-url) + control plane + learner + N rollout + M reward workers

One config for all. The launcher resolves what every role must agree on before starting them
(the model directory, building the bundled tiny model once), writes that config to
`<run dir>/up/config.yaml`, starts the roles, prefixes and streams their logs, and supervises
them: a role that dies is restarted (a restarted learner resumes from its last checkpoint), up
to `max_restarts` times each, and so is the redis-server it started (on its port, from its AOF).

Ports are chosen, never assumed, so that runs live side by side on one machine: Redis takes a free
port; the learner binds its weight-broadcast store to any free port at each start and announces it in
the run's Redis, where the workers find it (`system.broadcast_port` 0, stare.weight_sync.rendezvous);
the launcher binds the API's socket itself (the configured port if free, else a free one, saying who
holds the configured one) and hands it to the control role, which keeps the port across restarts;
`system.health_port` is off (the launcher watches the roles). It stops everything when the learner
finishes, or on Ctrl-C / SIGTERM: SIGTERM to every role (each finishes its batch; the learner checkpoints), SIGKILL to
those still running after `grace_s`, then Redis (its AOF keeps the streams). With
`system.colocate: on` the learner ranks sample (no rollout processes).
"""

from __future__ import annotations

import errno
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import yaml

from stare.config import ConfigError, TrainConfig, build_config
from stare.config.colocation import check_node_colocation, node_colocated
from stare.models.context import check_context, model_positions
from stare.observe.files import write_atomic
from stare.plan.check import check_fits
from stare.plan.gpu_map import GpuPlan
from stare.runtime.net import port_taken_message
from stare.runtime.run_lock import RunLock
from stare.runtime.threads import check_threads
from stare.transport.record_tag import RECORD_KEY_FILE_ENV
from stare.transport.redis_secrets import URL_ENV, URL_FILE_ENV, write_secret

COLORS = ("36", "33", "35", "32", "34", "31", "96", "93", "95", "92")


API_TOKEN_ENV = "STARE_API_TOKEN"  # services.control.auth.TOKEN_ENV (not imported: FastAPI is the services extra)
CONTROL_FD_ENV = "STARE_CONTROL_FD"  # services.control.server.LISTEN_FD_ENV: the API socket handed to the control role


def role_env(name: str, base: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    """The environment of role `name`: `base` plus `extra`, least privilege: the API token
    (STARE_API_TOKEN) only for the control plane, the record key file (STARE_RECORD_KEY_FILE: who may
    feed the learner) only for the others, no Redis URL variable (the 0600 file in `extra` wins anyway),
    no health port (one machine: roles would collide on it)."""
    env = {**base, **extra}
    env.pop("STARE_HEALTH_PORT", None)
    env.pop(URL_ENV, None)
    env.pop(API_TOKEN_ENV if name != "control" else RECORD_KEY_FILE_ENV, None)
    return env


@dataclass
class Role:
    name: str  # learner, control, rollout-0, reward-1, ...
    argv: list[str]
    proc: subprocess.Popen | None = None
    restarts: int = 0
    exits: list[int] = field(default_factory=list)
    color: str = "0"

    @property
    def kind(self) -> str:
        return self.name.split("-")[0]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def with_overrides(cfg: TrainConfig, overrides: dict[str, object]) -> TrainConfig:
    """`cfg` with `{"section.field": value}` replaced, validated again."""
    raw = cfg.model_dump(mode="json")
    for key, value in overrides.items():
        section, name = key.split(".")
        raw[section][name] = value
    return build_config(raw)


def start_redis(dir, say: Callable[[str], None]):
    """A redis-server on a free local port with its AOF in `dir` (fsync always: a crash of the
    machine loses no acknowledged trajectory)."""
    from services.redis_server import RedisServer

    server = RedisServer.on_free_port(Path(dir), appendfsync="always")  # with a password generated for this run
    say(f"redis-server on {server.public_url} (AOF in {server.dir}; password in {server.dir / 'redis.conf'})")
    return server


# ---------------------------------------------------------------- GPU assignment (stare.plan.gpu_map)
def role_names(rollout: int, reward: int, control: bool) -> list[str]:
    return (
        (["control"] if control else [])
        + ["learner"]
        + [f"rollout-{i}" for i in range(rollout)]
        + [f"reward-{i}" for i in range(reward)]
    )


def role_argv(name: str, config_path: Path) -> list[str]:
    kind = name.split("-")[0]
    argv = [sys.executable, "-m", "stare.app.cli", kind, "--config", str(config_path)]
    return argv + (["--name", name] if kind != "control" else [])


def gpu_env(plan: GpuPlan | None, name: str) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES of role `name` under `plan` (nothing set on a node without GPUs)."""
    return {} if plan is None or plan.gpus == 0 else {"CUDA_VISIBLE_DEVICES": plan.devices(name)}


class ProcessLauncher:
    """Every role a process of this machine (the module docstring); a stare.app.launch.base.Launcher."""

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        rollout: int = 1,
        reward: int = 1,
        redis_url: str | None = None,
        control: bool = True,
        max_restarts: int = 5,
        grace_s: float = 60.0,
        out: TextIO | None = None,
        color: bool | None = None,
        gpu_plan: GpuPlan | None = None,
    ):
        colocated = node_colocated(cfg)
        if colocated:
            check_node_colocation(cfg)
        if (rollout < 1 and not colocated) or reward < 1:
            raise ConfigError(
                f"--rollout ({rollout}) and --reward ({reward}) must be >= 1: the run needs at least one worker of each"
            )
        if colocated and rollout:
            raise ConfigError(
                f"--rollout {rollout} with system.colocate on: the learner ranks sample, no rollout worker "
                "runs; drop --rollout, or set system.colocate=off"
            )
        self.redis = None
        self.out = out or sys.stdout
        self.color = self.out.isatty() if color is None else color
        self.max_restarts, self.grace_s = max_restarts, grace_s
        self.lock = threading.Lock()
        # one writer per run folder (stare.runtime.run_lock), held until stop(); the learner inherits it
        self.run_lock = RunLock(cfg.run_dir, resume=True, say=self.say).acquire()
        try:
            self._prepare(cfg, rollout=rollout, reward=reward, control=control, colocated=colocated, gpu_plan=gpu_plan)
        except BaseException:
            self.run_lock.release()
            raise
        self.redis_url = redis_url
        self.stopping = False
        self.force_stop = False  # a second Ctrl-C: stop() kills instead of waiting

    def _prepare(
        self, cfg: TrainConfig, *, rollout: int, reward: int, control: bool, colocated: bool, gpu_plan: GpuPlan | None
    ) -> None:
        """Resolve what every role must agree on (model, ports), check it, write the roles' config."""
        overrides: dict[str, object] = {}
        if cfg.model.path is None:
            from stare.models.resolve import resolve_model

            overrides["model.path"] = str(resolve_model(cfg, self.say))
        s = cfg.system
        if s.weight_sync == "broadcast":
            overrides["system.broadcast_port"] = 0  # each learner start binds a free one and announces it in Redis
        if s.health_port:
            self.say(f"system.health_port {s.health_port} is off under stare up: the roles share this machine")
            overrides["system.health_port"] = 0
        self.control_socket = self._bind_control(cfg) if control else None
        if self.control_socket is not None:
            overrides["control_plane.port"] = self.control_socket.getsockname()[1]
        self.cfg = with_overrides(cfg, overrides)
        check_threads(self.cfg)
        check_context(self.cfg, *model_positions(self.cfg, self.cfg.model.path))
        check_fits(
            self.cfg, self.cfg.model.path, roles=("learner",) if colocated else ("learner", "rollout"), log=self.say
        )
        self.dir = self.cfg.run_dir / "up"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.dir / "config.yaml"
        write_atomic(self.config_path, yaml.safe_dump(self.cfg.model_dump(mode="json"), sort_keys=False))
        self.roles: dict[str, Role] = {}
        self.gpu_plan = gpu_plan
        for i, name in enumerate(role_names(rollout, reward, control)):
            self.roles[name] = Role(name, role_argv(name, self.config_path), color=COLORS[i % len(COLORS)])
        self.redis_restarts = 0

    def _bind_control(self, cfg: TrainConfig) -> socket.socket:
        """The API's listening socket, bound here and handed to the control role (no port race between two
        runs, and a restarted control role keeps its URL): the configured port, else a free one."""
        from services.control.server import bind

        c = cfg.control_plane
        try:
            return bind(c.host, c.port, fallback=False)
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                raise
        self.say(port_taken_message("control_plane.port", c.host, c.port, "the API takes a free port instead"))
        return bind(c.host, 0)

    def _record_key_file(self) -> Path:
        """The run's record key (stare.transport.record_tag), one per run folder, kept across invocations:
        the Redis password changes with every `stare up` while the records in its AOF stay."""
        path = self.dir / "record.key"
        if not path.exists() or not path.read_text().strip():
            write_secret(path, secrets.token_hex(32))
        return path

    # ---------------------------------------------------------------- output
    def say(self, text: str, who: str = "up", color: str = "1") -> None:
        prefix = f"\033[{color}m{who:>10} |\033[0m " if self.color else f"{who:>10} | "
        with self.lock:
            self.out.write(prefix + text.rstrip("\n") + "\n")
            self.out.flush()

    def _pump(self, role: Role, stream) -> None:
        for line in iter(stream.readline, ""):
            self.say(line, role.name, role.color)
        stream.close()

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self.redis_url is None:
            self.redis = start_redis(self.dir / "redis", self.say)
            self.redis_url = self.redis.url
        # the roles read the URL (with its password) from a 0600 file, never from argv or the environment
        self.redis_url_file = write_secret(self.dir / "redis.url", self.redis_url)
        self.record_key_file = self._record_key_file()
        for role in self.roles.values():
            self._spawn(role)
        if "control" in self.roles:
            c = self.cfg.control_plane
            host = "127.0.0.1" if c.host in ("0.0.0.0", "::") else c.host
            self.say(f"API http://{host}:{c.port}/v1/status  dashboard http://{host}:{c.port}/")
        self.say(f"run folder {self.cfg.run_dir}; Ctrl-C stops every role")

    def _spawn(self, role: Role) -> None:
        from learner.engine.deepspeed_engine import child_env

        env = role_env(
            role.name,
            child_env(),
            {
                URL_FILE_ENV: str(self.redis_url_file),
                **({RECORD_KEY_FILE_ENV: str(self.record_key_file)} if role.kind != "control" else {}),
                "PYTHONUNBUFFERED": "1",
                "STARE_WORKER_NAME": role.name,
                "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"),  # c10d's reconnect chatter
                "HF_HUB_OFFLINE": "1",
                **gpu_env(self.gpu_plan, role.name),
                **(self.run_lock.child_env() if role.kind == "learner" else {}),
            },
        )
        fds: tuple[int, ...] = ()
        if role.kind == "control" and self.control_socket is not None:
            fds = (self.control_socket.fileno(),)
            env[CONTROL_FD_ENV] = str(fds[0])
        # the learner (and a learner restarted here) inherits the locked descriptor: it writes under our lock
        if role.kind == "learner" and self.run_lock.fd is not None:
            fds += (self.run_lock.fd,)
        role.proc = subprocess.Popen(
            role.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
            pass_fds=fds,
        )
        threading.Thread(target=self._pump, args=(role, role.proc.stdout), daemon=True).start()
        self.say(f"started {role.name} (pid {role.proc.pid})")

    def supervise(self, until: Callable[[], bool] = lambda: False, poll_s: float = 0.5) -> int:
        """Restart dead roles until the learner finishes (returns its exit code), `until()` holds
        (returns 0), or a role exhausts its restarts (returns 1)."""
        while not self.stopping:
            if until():
                return 0
            for role in self.roles.values():
                code = role.proc.poll() if role.proc is not None else None
                if code is None or self.stopping:
                    continue
                role.exits.append(code)
                if role.name == "learner" and code == 0:
                    self.say("learner finished")
                    return 0
                if role.restarts >= self.max_restarts:
                    self.say(f"{role.name} exited with {code} and was restarted {role.restarts} times; giving up")
                    return 1
                role.restarts += 1
                self.say(f"{role.name} exited with {code}; restarting ({role.restarts}/{self.max_restarts})")
                self._spawn(role)
            if self.redis is not None and not self.redis.alive() and not self.stopping and not self._restart_redis():
                return 1
            time.sleep(poll_s)
        return 0

    def _restart_redis(self) -> bool:
        """Our redis-server died: start it again on its port, from its AOF (the roles reconnect by
        themselves). False once it was restarted `max_restarts` times, or cannot start."""
        code = self.redis.proc.returncode if self.redis.proc is not None else None
        if self.redis_restarts >= self.max_restarts:
            self.say(f"redis-server exited with {code} and was restarted {self.redis_restarts} times; giving up")
            return False
        self.redis_restarts += 1
        self.say(
            f"redis-server exited with {code}; restarting it on port {self.redis.port} from its AOF "
            f"({self.redis_restarts}/{self.max_restarts})"
        )
        try:
            self.redis.start(timeout_s=60.0)  # a long AOF takes a while to load
        except RuntimeError as err:
            self.say(f"redis-server did not start again: {err}")
            return self.redis_restarts < self.max_restarts
        return True

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to one role (tests: a worker dying mid-run)."""
        role = self.roles[name]
        if role.alive():
            os.killpg(role.proc.pid, sig)

    def stop(self) -> None:
        """SIGTERM every role, wait up to grace_s, SIGKILL the rest, then stop our Redis."""
        self.stopping = True
        order = [r for r in self.roles.values() if r.kind in ("rollout", "reward")] + [
            r for r in self.roles.values() if r.kind in ("learner", "control")
        ]
        for role in order:
            if role.alive():
                os.killpg(role.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for role in order:
            if role.proc is None:
                continue
            while role.proc.poll() is None and time.monotonic() < deadline and not self.force_stop:
                time.sleep(0.1)
            if role.proc.poll() is None:
                why = "a second Ctrl-C" if self.force_stop else f"it did not stop within {self.grace_s}s"
                self.say(f"killing {role.name}: {why}")
                os.killpg(role.proc.pid, signal.SIGKILL)
                role.proc.wait(timeout=10)
        if self.redis is not None:
            self.redis.stop()
        if self.control_socket is not None:
            self.control_socket.close()
        self.run_lock.release()  # every role has stopped: nothing of this run writes the folder any more
        self.say("stopped")
