"""`stare launch --ray`: the roles of `stare up` as Ray actors, on a Ray cluster of one or many nodes.

    Redis (--redis-url, or a local redis-server) + control plane + learner + N rollout + M reward
    actors, each role's `run(cfg, redis_url=..., name=..., stop=...)` in a thread of its actor

What it shares with `stare up` (stare/app/launch/up.py): one config for all roles, the model directory
resolved once before any role starts (the bundled tiny model is built here), supervision until
the learner finishes, then every role stopped (rollout and reward first; each finishes its
batch, the learner checkpoints), Ctrl-C / SIGTERM stops them all.

What Ray does instead of the launcher: placement with resource requests (learner and rollout
actors ask for `num_gpus`, 1 each by default when the cluster has GPUs, 0 on a CPU cluster) and
restarts. An actor whose process dies (SIGKILL, OOM, `os._exit`), or whose role raised, is
restarted by Ray up to `max_restarts` times; the restarted actor runs its role again under the
same name, so it first re-reads the stream entries it held (as a restarted `stare up` process
does), and a restarted learner resumes from its last checkpoint.

Weight broadcast: the learner actor hosts the TCPStore on its node's IP
(`ray.util.get_node_ip_address()`, listening on 0.0.0.0), on `system.broadcast_port` or a free
port if that is taken there; each rollout actor asks the learner actor for that address when it
starts. A learner restarted on another node (or port) gets the rollout actors restarted so they
dial the new address.

Limits: every node must reach Redis and see the same paths (model.path, run.output_dir:
a shared volume); a redis-server this launcher starts listens on 127.0.0.1, so it serves a
single-node cluster only (multi-node or `ray://` clients need `--redis-url`). The learner is one
actor (one data-parallel rank). Ray is imported only here, after argument parsing.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from stare.app.launch.processes import start_redis, with_overrides
from stare.app.launch.ray_actor import RoleActor, _call, _ray
from stare.app.launch.run import run_until_done
from stare.config import ConfigError, TrainConfig
from stare.runtime.run_lock import RunLock

log = logging.getLogger(__name__)


class RayLauncher:
    """Starts, supervises and stops the roles as Ray actors (see the module docstring).

    `init_kwargs` go to `ray.init` when this process is not connected to Ray yet (tests: a local
    cluster with `num_cpus`, `_temp_dir`); a Ray this launcher started is shut down by `stop()`."""

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        rollout: int = 1,
        reward: int = 1,
        redis_url: str | None = None,
        control: bool = True,
        address: str | None = None,
        learner_gpus: float | None = None,
        rollout_gpus: float | None = None,
        cpus_per_role: float = 1.0,
        max_restarts: int = 5,
        grace_s: float = 60.0,
        start_timeout_s: float = 600.0,
        call_timeout_s: float = 60.0,
        init_kwargs: dict | None = None,
        out: TextIO | None = None,
    ):
        if rollout < 1 or reward < 1:
            raise ConfigError(f"--rollout ({rollout}) and --reward ({reward}) must be >= 1")
        for flag, value in (("--learner-gpus", learner_gpus), ("--rollout-gpus", rollout_gpus)):
            if value is not None and value < 0:
                raise ConfigError(f"{flag} ({value}) must be >= 0")
        if max_restarts < 0:
            raise ConfigError(f"--max-restarts ({max_restarts}) must be >= 0")
        self.out = out or sys.stdout
        self.lock = threading.Lock()
        self.address, self.init_kwargs = address, dict(init_kwargs or {})
        self.learner_gpus, self.rollout_gpus, self.cpus_per_role = learner_gpus, rollout_gpus, cpus_per_role
        self.max_restarts, self.grace_s = max_restarts, grace_s
        self.start_timeout_s, self.call_timeout_s = start_timeout_s, call_timeout_s
        if cfg.model.path is None:  # once, here: every actor loads the same directory
            from stare.models.resolve import resolve_model

            cfg = with_overrides(cfg, {"model.path": str(resolve_model(cfg, self.say))})
        self.cfg = cfg
        self.dir = cfg.run_dir / "ray"
        self.redis_url, self.redis = redis_url, None
        self.names = (
            (["control"] if control else [])
            + ["learner"]
            + [f"rollout-{i}" for i in range(rollout)]
            + [f"reward-{i}" for i in range(reward)]
        )
        self.actors: dict[str, Any] = {}
        self.pids: dict[str, int] = {}
        self.restarts: dict[str, int] = dict.fromkeys(self.names, 0)
        self.endpoint: tuple[str, int] | None = None
        self.control_url: str | None = None
        self.stopping = False
        self._owns_ray = False
        self.run_lock: RunLock | None = None

    def _actor_name(self, name: str) -> str:
        return f"stare-{self.cfg.run.name}-{name}"

    def say(self, text: str, who: str = "ray") -> None:
        with self.lock:
            self.out.write(f"{who:>10} | {text.rstrip()}\n")
            self.out.flush()

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        ray = _ray()
        deadline = time.monotonic() + self.start_timeout_s  # one limit for the whole start
        # one writer per run folder: this driver holds it, its learner actor works under it (the token)
        self.run_lock = RunLock(self.cfg.run_dir, resume=True, say=self.say).acquire()

        def left() -> float:
            return max(deadline - time.monotonic(), 1.0)

        if not ray.is_initialized():
            address, kwargs = self.address or os.environ.get("RAY_ADDRESS"), dict(self.init_kwargs)
            if address is None:  # a new local instance, with a CPU slot for each role whatever the cores
                address = "local"
                kwargs.setdefault("num_cpus", max(os.cpu_count() or 1, math.ceil(len(self.names) * self.cpus_per_role)))
            ray.init(address=address, **kwargs)
            self._owns_ray = True
        resources = ray.cluster_resources()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        gpus = resources.get("GPU", 0)
        self.say(f"Ray {ray.__version__}: {len(nodes)} node(s), {resources.get('CPU', 0):g} CPUs, {gpus:g} GPUs")
        # the learner actor's process starts its other ranks itself (learner.process.rank_launch): one GPU each
        ranks = self.cfg.system.learner_ranks
        learner_gpus = self.learner_gpus if self.learner_gpus is not None else (ranks if gpus else 0)
        rollout_gpus = self.rollout_gpus if self.rollout_gpus is not None else (1 if gpus else 0)
        n_rollout = sum(n.startswith("rollout") for n in self.names)
        if len(self.names) * self.cpus_per_role > resources.get("CPU", 0):
            self.say(
                f"warning: the roles ask for {len(self.names) * self.cpus_per_role:g} CPUs, the cluster has "
                f"{resources.get('CPU', 0):g}: actors wait for CPUs until --start-timeout-s"
            )
        if learner_gpus + n_rollout * rollout_gpus > gpus:
            self.say(
                f"warning: the roles ask for {learner_gpus + n_rollout * rollout_gpus:g} GPUs, the cluster has "
                f"{gpus:g}: actors wait for GPUs until --start-timeout-s (or set --learner-gpus/--rollout-gpus)"
            )
        if self.redis_url is None:
            client = ray.util.client.ray.is_connected()
            if len(nodes) > 1 or client:
                raise SystemExit(
                    f"the Ray cluster has {len(nodes)} node(s){' and this is a ray:// client' * client}: "
                    "a redis-server started here listens on 127.0.0.1 only; pass --redis-url with a "
                    "Redis every node reaches (e.g. redis://stare-redis:6379/0)"
                )
            self.dir.mkdir(parents=True, exist_ok=True)
            self.redis = start_redis(self.dir / "redis", self.say)
            self.redis_url = self.redis.url
        Actor = ray.remote(RoleActor)
        raw = self.cfg.model_dump(mode="json")

        def create(name: str, num_gpus: float, **kwargs):
            kind = name.split("-")[0]
            options = {
                "name": self._actor_name(name),
                "num_cpus": self.cpus_per_role,
                "num_gpus": num_gpus,
                "max_restarts": self.max_restarts,
                "max_task_retries": 0,
                "max_concurrency": 4,
            }  # status and stop answer while another call waits
            if kind == "learner":
                kwargs["lock_token"] = self.run_lock.token
            self.actors[name] = Actor.options(**options).remote(
                kind, name, raw, self.redis_url, call_timeout_s=self.call_timeout_s, **kwargs
            )

        if "control" in self.names:
            create("control", 0)
        create("learner", learner_gpus)
        self.endpoint = _call(ray, self.actors["learner"], "endpoint", timeout_s=left(), what="learner actor start")
        for name in self.names:
            if name.startswith("rollout"):
                create(name, rollout_gpus, learner=self._actor_name("learner"))
            elif name.startswith("reward"):
                create(name, 0)
        for name, actor in self.actors.items():
            st = _call(ray, actor, "status", timeout_s=left(), what=f"{name} actor start")
            self.pids[name] = st["pid"]
            self.say(f"started {name} on {st['host']} (pid {st['pid']})")
        if "control" in self.actors:
            wait_s = left()
            self.control_url = _call(
                ray, self.actors["control"], "control_url", wait_s, timeout_s=wait_s + 5, what="control plane start"
            )
            if self.control_url is None:
                raise RuntimeError(
                    f"the control plane did not answer within {self.start_timeout_s}s (--start-timeout-s; see its log)"
                )
            self.say(f"API {self.control_url}/v1/status  dashboard {self.control_url}/")
        if self.cfg.system.weight_sync == "broadcast":
            self.say(f"weight broadcast rendezvous at {self.endpoint[0]}:{self.endpoint[1]}")
        self.say(f"run folder {self.cfg.run_dir} (on the learner's node); Ctrl-C stops every role")

    def supervise(self, until: Callable[[], bool] = lambda: False, poll_s: float = 1.0) -> int:
        """Watch the actors until the learner finishes (returns 0), `until()` holds (0), or an actor
        is dead for good: Ray gave up restarting it, or the learner's role failed (1)."""
        ray = _ray()
        while not self.stopping:
            if until():
                return 0
            refs = {name: actor.status.remote() for name, actor in self.actors.items()}
            deadline = time.monotonic() + self.call_timeout_s
            for name, ref in refs.items():
                try:
                    st = ray.get(ref, timeout=max(deadline - time.monotonic(), 0.1))
                except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
                    continue  # restarting, or busy: the next poll sees it
                except ray.exceptions.ActorDiedError as err:
                    if self.stopping:
                        return 0
                    self.say(
                        f"{name} is dead and Ray will not restart it (max_restarts {self.max_restarts}): "
                        f"{str(err).splitlines()[0]}"
                    )
                    return 1
                except ray.exceptions.RayActorError:
                    continue  # died during this call; Ray restarts it
                if st["pid"] != self.pids[name]:
                    self.restarts[name] += 1
                    self.say(
                        f"{name} was restarted by Ray on {st['host']} (pid {self.pids[name]} -> {st['pid']}; "
                        f"{self.restarts[name]}/{self.max_restarts})"
                    )
                    self.pids[name] = st["pid"]
                if name == "learner":
                    if st["finished"]:
                        self.say("learner finished")
                        return 0
                    if st["endpoint"] != self.endpoint:
                        self._follow_learner(tuple(st["endpoint"]))
            time.sleep(poll_s)
        return 0

    def _follow_learner(self, endpoint: tuple[str, int]) -> None:
        """The learner came back on another address: restart the rollout actors, which ask it anew."""
        ray = _ray()
        self.say(f"the learner's broadcast address moved {self.endpoint} -> {endpoint}; restarting rollout actors")
        self.endpoint = endpoint
        for name, actor in self.actors.items():
            if name.startswith("rollout"):
                ray.kill(actor, no_restart=False)

    def kill(self, name: str) -> int:
        """SIGKILL one actor's process (tests: a worker dying mid-run); returns its pid."""
        pid = self.pids[name]
        os.kill(pid, signal.SIGKILL)  # a local cluster: the actor's process is on this machine
        return pid

    def stop(self) -> None:
        """Stop every role (rollout and reward first), wait up to grace_s, kill what is left, stop
        our Redis and, if this launcher started Ray, shut it down."""
        ray = _ray()
        self.stopping = True
        order = [n for n in self.actors if n.startswith(("rollout", "reward"))] + [
            n for n in self.actors if n in ("learner", "control")
        ]
        refs = {}
        for name in order:
            refs[name] = self.actors[name].stop.remote(self.grace_s)
        deadline = time.monotonic() + self.grace_s + 5
        for name, ref in refs.items():
            try:
                st = ray.get(ref, timeout=max(deadline - time.monotonic(), 0.1))
                if st["running"]:
                    self.say(f"{name} did not stop within {self.grace_s}s; killing it")
            except ray.exceptions.GetTimeoutError:
                self.say(f"{name} did not answer stop within {self.grace_s}s; killing it")
            except ray.exceptions.RayActorError as err:
                self.say(f"{name} was not running: {str(err).splitlines()[0]}")
        for actor in self.actors.values():
            ray.kill(actor, no_restart=True)
        if self.redis is not None:
            self.redis.stop()
        if self._owns_ray:
            ray.shutdown()
        if self.run_lock is not None:
            self.run_lock.release()
        self.say("stopped")


def launch_ray(
    cfg: TrainConfig,
    *,
    address: str | None,
    rollout: int,
    reward: int,
    redis_url: str | None,
    control: bool = True,
    learner_gpus: float | None = None,
    rollout_gpus: float | None = None,
    max_restarts: int = 5,
    start_timeout_s: float = 600.0,
) -> int:
    from stare.config.colocation import node_colocated

    if node_colocated(cfg):
        raise ConfigError(
            "stare launch --ray does not run the node-colocated learner (system.colocate on) yet: run it "
            "with `stare up` on one node, or set system.colocate=off for rollout actors of their own"
        )
    launcher = RayLauncher(
        cfg,
        rollout=rollout,
        reward=reward,
        redis_url=redis_url,
        control=control,
        address=address,
        learner_gpus=learner_gpus,
        rollout_gpus=rollout_gpus,
        max_restarts=max_restarts,
        start_timeout_s=start_timeout_s,
    )
    return run_until_done(launcher)
