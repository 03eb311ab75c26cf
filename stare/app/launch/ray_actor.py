"""The Ray actor that runs one role of `stare launch --ray` (stare/app/launch/ray.py) in a thread, and
calling an actor with a deadline that waits out its restarts."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
import warnings
from typing import Any

from stare.app.launch.processes import with_overrides
from stare.runtime.net import free_port, port_free
from stare.runtime.run_lock import TOKEN_ENV
from stare.weight_sync.factory import broadcast_bind_host

log = logging.getLogger(__name__)

# what every role actor's process gets in its environment (as `stare up` sets for its children)
ACTOR_ENV = {
    "HF_HUB_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
    "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"),
}  # c10d's reconnect chatter


def _ray():
    try:
        import ray
    except ImportError:
        raise SystemExit("stare launch --ray needs Ray: pip install 'stare[ray]' (ray[default]==2.60.0)") from None
    return ray


class RoleActor:
    """One role in a Ray actor (wrapped by `ray.remote` in `RayLauncher.start`, so importing this
    module does not import Ray). `__init__` starts the role in a thread with a stop Event, so a
    restart by Ray starts the role again; a role that raises, or (rollout, reward) returns without
    being stopped, ends the actor's process so that Ray restarts it. A finished learner stays up,
    reporting `finished`, until the launcher stops every actor."""

    def __init__(
        self,
        kind: str,
        name: str,
        cfg_raw: dict,
        redis_url: str,
        learner: str | None = None,
        call_timeout_s: float = 60.0,
        lock_token: str | None = None,
    ):
        ray = _ray()
        from stare.config import build_config

        os.environ.update(ACTOR_ENV)
        os.environ.pop("STARE_HEALTH_PORT", None)  # several roles share a node; Ray watches the actors
        if lock_token is not None:  # the learner works under the driver's run lock (stare.runtime.run_lock)
            os.environ[TOKEN_ENV] = lock_token
        self.kind, self.name, self.redis_url = kind, name, redis_url
        self.pid = os.getpid()
        with warnings.catch_warnings():  # Ray's own deprecated call inside this property
            warnings.simplefilter("ignore")
            self.reconstructed = ray.get_runtime_context().was_current_actor_reconstructed
        self.host = ray.util.get_node_ip_address()
        self.stop_event = threading.Event()
        self.finished, self.error, self.url = False, None, None
        self.stop_requested = False  # by the launcher (RoleRuntime sets stop_event itself on exit)
        self.serving = threading.Event()  # control: the API answers
        cfg = build_config(cfg_raw)
        s = cfg.system
        overrides: dict[str, object] = {"system.health_port": 0}
        if s.weight_sync == "broadcast" and kind == "learner":
            bind = broadcast_bind_host(self.host)  # where the learner's publisher will listen
            port = s.broadcast_port if port_free(bind, s.broadcast_port) else free_port(bind)
            overrides.update({"system.broadcast_host": self.host, "system.broadcast_port": port})
        elif s.weight_sync == "broadcast" and kind == "rollout" and learner is not None:
            # the learner actor by name, not a handle in the arguments: Ray keeps only inline
            # arguments for an actor's restart (ray-project/ray#53727)
            host, port = _call(
                ray,
                ray.get_actor(learner),
                "endpoint",
                timeout_s=call_timeout_s,
                what="the learner's broadcast address",
            )
            overrides.update({"system.broadcast_host": host, "system.broadcast_port": port})
        self.cfg = with_overrides(cfg, overrides)
        self.thread = threading.Thread(target=self._main, name=f"stare-{name}", daemon=True)
        self.thread.start()

    def __repr__(self) -> str:  # Ray prefixes the actor's log lines with this
        return self.name

    def _main(self) -> None:
        from learner.engine.deepspeed_engine import LAUNCH_ENV
        from stare.runtime.process import setup_logging

        # A local Ray instance's workers inherit the driver's environment: a driver that trained in
        # process (tests, notebooks) holds a process group on its MASTER_PORT, which a learner
        # actor reading the same variables would try to bind. Each role forms its own group.
        for key in LAUNCH_ENV:
            os.environ.pop(key, None)
        setup_logging(self.kind, self.name, fmt=self.cfg.logging.format)
        try:
            if self.kind == "control":
                self._serve_control()
            else:
                from stare.app.launch.role_entry import run_role

                run_role(self.kind, self.cfg, redis_url=self.redis_url, name=self.name, stop=self.stop_event)
        except Exception:
            self.error = traceback.format_exc()
            log.error("%s failed:\n%s", self.name, self.error)
            if not self.stop_requested:
                self._exit_for_restart()
            return
        if self.kind == "learner":
            self.finished = not self.stop_requested
        elif not self.stop_requested:
            log.error("%s returned without being stopped", self.name)
            self._exit_for_restart()

    def _exit_for_restart(self) -> None:
        """End this actor's process: Ray restarts the actor (until max_restarts), as `stare up`
        restarts a role process that exited."""
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    def _serve_control(self) -> None:
        from services.control.app import create_app
        from services.control.server import BackgroundServer
        from stare.runstate.redis_state import RedisRunState

        cfg = self.cfg
        state = RedisRunState.connect(self.redis_url, cfg.run.name, dead_after_s=cfg.system.dead_after_s)
        server = BackgroundServer(
            create_app(state, cfg.control_plane, cfg.run.name), cfg.control_plane.host, cfg.control_plane.port
        )
        server.start()
        port = server.sock.getsockname()[1]
        self.url = (
            f"http://{self.host if cfg.control_plane.host in ('0.0.0.0', '::') else cfg.control_plane.host}:{port}"
        )
        self.serving.set()
        try:
            self.stop_event.wait()
        finally:
            server.stop()

    # ---------------------------------------------------------------- methods the launcher calls
    def endpoint(self) -> tuple[str, int]:
        """The learner's weight-broadcast address (host, port)."""
        s = self.cfg.system
        return s.broadcast_host, s.broadcast_port

    def control_url(self, timeout_s: float) -> str | None:
        """The control plane's URL once it answers (None: not within timeout_s, or it failed)."""
        self.serving.wait(timeout_s)
        return self.url

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "host": self.host,
            "reconstructed": self.reconstructed,
            "running": self.thread.is_alive(),
            "finished": self.finished,
            "error": self.error,
            "endpoint": self.endpoint() if self.kind == "learner" else None,
            "url": self.url,
        }

    def stop(self, timeout_s: float) -> dict[str, Any]:
        """Set the role's stop Event (it finishes its batch; the learner checkpoints) and wait."""
        self.stop_requested = True
        self.stop_event.set()
        self.thread.join(timeout_s)
        return self.status()


def _call(ray, actor, method: str, *args, timeout_s: float, what: str):
    """`actor.method(*args)` with a deadline, waiting out a restart (ActorUnavailableError)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(getattr(actor, method).remote(*args), timeout=max(deadline - time.monotonic(), 0.1))
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: the actor was unavailable (restarting) for {timeout_s}s") from None
            time.sleep(0.2)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"{what}: no answer within {timeout_s}s") from None
