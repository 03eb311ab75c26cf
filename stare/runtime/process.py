"""What every role process of the distributed system shares (`stare rollout|reward|learner`).

`RoleRuntime` gives a role: log lines tagged with role, name and pid; SIGTERM/SIGINT -> a stop
event the main loop checks between batches (a second SIGINT aborts); heartbeats in Redis from a
background thread (so a long batch does not look like a death), carrying what the loop last
reported with `tick(...)`; and an HTTP liveness endpoint `GET /healthz` on `system.health_port`
(or STARE_HEALTH_PORT), 200 while the main loop ticked within `system.stall_s`, else 503.

Long work (an evaluation, a training step, a model load) runs inside `with rt.busy("evaluating"):`.
While it runs, the heartbeat thread keeps the liveness fresh as long as the busy thread makes
progress: its CPU time grows (read from its per-thread CPU clock; compute, and CUDA
synchronisation, which spins, count) or it calls `rt.tick()`. A thread that hangs (deadlocked,
blocked on a dead peer's collective or socket) uses no CPU, so `stall_s` later it is reported
(503, "busy: evaluating, no progress for N s"). The compose and Kubernetes liveness probes are
derived from `system.stall_s` (docs/deploy.md). The liveness part is stare/runtime/liveness.py, which `stare train`
uses too.

Worker names: `--name`, else STARE_WORKER_NAME, else `<role>-<host>-<pid>`. A name is the
worker's stream consumer name: a worker restarted under the same name first re-reads what it held.
A name ending in `{slot}` (compose's replicas: STARE_WORKER_NAME=rollout-cpu-{slot}) in a compose
container takes the container's number: container stare-rollout-cpu-2 (compose's
<project>-<service>-<n>, read from Docker's DNS: stare.runtime.container_name) is worker
rollout-cpu-2, so `docker compose ps` and /v1/status name it alike. Elsewhere a `{slot}` takes the
lowest slot 1, 2, ... whose worker is not alive (stopped, dead, forgotten) or ran on this same host,
reserved in Redis for `dead_after_s` so workers starting together differ. Either way a redeployed
replica takes its predecessor's name and pending entries. On a clean exit a role
sends a last `gone` heartbeat; /v1/status lists it as gone (not alive) until `forget_after_s`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from contextlib import AbstractContextManager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stare.config import ConfigError, TrainConfig, staleness
from stare.runtime.liveness import Liveness

if TYPE_CHECKING:
    from types import FrameType

    from stare.runstate.base import RunState
    from stare.transport.redis_transport import RedisTransport

log = logging.getLogger(__name__)


SLOT = "{slot}"
MAX_SLOTS = 4096


def worker_name(role: str, name: str | None) -> str:
    return name or os.environ.get("STARE_WORKER_NAME") or f"{role}-{socket.gethostname()}-{os.getpid()}"


def claim_slot(state: RunState, role: str, template: str, *, host: str, ttl_s: float) -> str:
    """`template` with `{slot}` replaced by the lowest slot no other live worker holds (see the
    module docstring); `state` is a RunState with `claim_name`."""
    held = {h.name: h for h in state.roles() if h.role == role}
    for slot in range(1, MAX_SLOTS + 1):
        name = template.replace(SLOT, str(slot))
        other = held.get(name)
        if other is not None and other.alive and other.host != host:
            continue
        if state.claim_name(role, name, host, ttl_s):
            return name
    raise ConfigError(f"STARE_WORKER_NAME {template!r}: all {MAX_SLOTS} slots are held by live {role} workers")


def resolve_worker_name(role: str, name: str | None, cfg: TrainConfig, url: str) -> str:
    """worker_name(), with a `{slot}` at its end taken from this container's compose number (its name
    ends with the template's prefix and a number: container stare-rollout-cpu-2 is worker
    rollout-cpu-2), else claimed in the run's Redis state (the lowest free slot)."""
    name = worker_name(role, name)
    if SLOT not in name:
        return name
    if name.endswith(SLOT):
        from stare.runtime.container_name import container_name, replica_number

        own = container_name()
        number = replica_number(own, name.removesuffix(SLOT))
        if number is not None:
            log.info("worker name %s from this container's name %s", name.replace(SLOT, str(number)), own)
            return name.replace(SLOT, str(number))
    from stare.runstate.redis_state import RedisRunState

    s = cfg.system
    state = RedisRunState.connect(url, cfg.run.name, dead_after_s=s.dead_after_s, forget_after_s=s.forget_after_s)
    try:
        return claim_slot(state, role, name, host=socket.gethostname(), ttl_s=s.dead_after_s)
    finally:
        state.close()


def redis_url(cfg: TrainConfig, override: str | None, url_file: str | None = None) -> str:
    """--redis-url, --redis-url-file, STARE_REDIS_URL_FILE, STARE_REDIS_URL, system.redis_url; plus
    STARE_REDIS_PASSWORD_FILE (see stare.transport.redis_secrets). Never log it: log masked(url)."""
    from stare.transport.redis_secrets import SecretError, resolve_url

    try:
        return resolve_url(cfg.system.redis_url, url=override, url_file=url_file)
    except SecretError as err:
        raise ConfigError(str(err)) from None


def stream_backlog(cfg: TrainConfig) -> int:
    """The bound on each run stream's unacknowledged entries (producers wait past it): system.max_backlog plus
    what the learner holds until its next checkpoint, (run.checkpoint_every + max staleness + 2) steps of
    prompts_per_step x samples_per_prompt rows."""
    rows = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    return int(cfg.system.max_backlog + (cfg.run.checkpoint_every + staleness(cfg).max_versions + 2) * rows)


def connect_transport(
    cfg: TrainConfig, url: str, vocab_size: int | None = None, model_path: Path | None = None
) -> RedisTransport:
    """The run's three Redis streams with the options every role uses: the scored stream also
    holds what the learner trained since its last checkpoint (acknowledged then), so its backlog
    bound and MAXLEN leave room for that. Records are tagged with the run's record key and read only
    if they verify and keep the run's bounds (`vocab_size`: the model's where the role loaded it,
    `model_path`: its folder where model.path is unset; stare.transport.record_tag); `transport.trust`
    goes to the evaluation streams too."""
    from stare.transport.record_limits import run_limits
    from stare.transport.record_tag import RecordTrust, record_key
    from stare.transport.redis_transport import RedisTransport

    key, source = record_key(cfg.run.name, url)
    if source is None:
        log.warning(
            "records are not authenticated: Redis has no password and STARE_RECORD_KEY_FILE is unset; give every "
            "role the same record key file so that only they can feed the learner (docs/transport.md)"
        )
    training, evaluation = run_limits(cfg, vocab_size, model_path)

    backlog = stream_backlog(cfg)
    return RedisTransport.connect(
        url, cfg.run.name, trust=RecordTrust(key, training, evaluation), **stream_options(cfg, backlog)
    )


def stream_options(cfg: TrainConfig, backlog: int) -> dict[str, Any]:
    """A role's options for the run's Redis streams, bounded at `backlog` unacknowledged entries (a
    stream holds only those: an acknowledgement deletes its entry; MAXLEN, twice that, is a safety net)."""
    s = cfg.system
    return dict(
        max_backlog=backlog,
        maxlen=2 * backlog,
        claim_idle_ms=int(s.claim_idle_s * 1000),
        block_ms=1000,
        publish_timeout_s=5.0,
        max_deliveries=s.max_deliveries,
    )


def setup_logging(role: str, name: str, level: int = logging.INFO, fmt: str = "text") -> None:
    """The role process's logging on stderr: text lines, or JSON objects with role and name (fmt json)."""
    from stare.observe.log_format import setup

    setup(
        fmt,
        f"%(asctime)s {role}[{name} pid=%(process)d] %(levelname)s %(name)s: %(message)s",
        static={"role": role, "name": name},
        level=level,
    )
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:  # no per-file progress bars in role logs
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass


class RoleRuntime:
    def __init__(
        self,
        role: str,
        name: str,
        cfg: TrainConfig,
        url: str,
        *,
        stall_s: float | None = None,
        stop: threading.Event | None = None,
    ):
        from stare.runstate.redis_state import RedisRunState
        from stare.runstate.steering import RunSteering

        self.role, self.name, self.cfg = role, name, cfg
        self.stop = stop or threading.Event()  # a caller's event (Ray actors, tests) or our own
        self._sigint = 0
        self._signalled = 0  # set by the signal handler, turned into `stop` by a watcher thread
        self.state = RedisRunState.connect(
            url, cfg.run.name, dead_after_s=cfg.system.dead_after_s, forget_after_s=cfg.system.forget_after_s
        )
        self.steering = RunSteering(self.state, role=role, name=name, heartbeat_s=cfg.system.heartbeat_s)
        # tick, busy, healthy and the heartbeat thread (stare/runtime/liveness.py), ending with `stop`
        self.liveness = Liveness(
            self.steering,
            heartbeat_s=cfg.system.heartbeat_s,
            stall_s=stall_s if stall_s is not None else cfg.system.stall_s,
            stop=self.stop,
        )
        self.stall_s, self.info = self.liveness.stall_s, self.liveness.info
        self._threads: list[threading.Thread] = []
        self._http: ThreadingHTTPServer | None = None

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> RoleRuntime:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        self.liveness.start()
        watcher = threading.Thread(target=self._watch_signals, name="signals", daemon=True)
        watcher.start()
        self._threads.append(watcher)
        port = int(os.environ.get("STARE_HEALTH_PORT", self.cfg.system.health_port))
        if port:
            self._serve_health(port)
        log.info("%s %s started (pid %d)", self.role, self.name, os.getpid())
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        self.liveness.close()
        for t in self._threads:
            t.join(timeout=5)
        try:  # after the heartbeat thread ended: nothing beats after this one
            self.steering.heartbeat(info=self.info, gone=True)
        except Exception as err:  # Redis gone too: the beat ages into "dead", then is forgotten
            log.warning("could not record the exit in Redis: %s", err)
        log.info("%s %s stopped", self.role, self.name)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Only plain assignments here: Event.set takes a lock the interrupted main thread may hold."""
        if signum == signal.SIGINT:
            self._sigint += 1
            if self._sigint > 1:
                raise KeyboardInterrupt
        self._signalled = signum

    def _watch_signals(self) -> None:
        """Turn a received signal into the stop event (outside the signal handler)."""
        while not self.stop.wait(0.1):
            if self._signalled:
                log.info("%s received: stopping after the current batch", signal.Signals(self._signalled).name)
                self.stop.set()

    # ---------------------------------------------------------------- liveness
    def tick(self, **info: Any) -> None:
        """The main loop is alive; `info` goes into the next heartbeat."""
        self.liveness.tick(**info)

    def healthy(self) -> bool:
        return self.liveness.healthy()

    def busy(self, what: str) -> AbstractContextManager[None]:
        """Long work on the calling thread: liveness stays fresh while this thread uses CPU (or
        ticks); a hung one is reported after `stall_s`. Nests (the outermost is watched)."""
        return self.liveness.busy(what)

    @property
    def last_tick(self) -> float:
        return self.liveness.last_tick

    def _serve_health(self, port: int) -> None:
        runtime = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/healthz":
                    self.send_error(404, "only GET /healthz here")
                    return
                ok = runtime.healthy()
                body = json.dumps(
                    {
                        "role": runtime.role,
                        "name": runtime.name,
                        "healthy": ok,
                        "busy": runtime.info.get("busy"),
                        "stall_s": runtime.stall_s,
                        "last_tick_s": round(time.monotonic() - runtime.last_tick, 3),
                    }
                ).encode()
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("0.0.0.0", port), Handler)
        self._http.timeout = 5
        t = threading.Thread(target=self._http.serve_forever, name="healthz", daemon=True)
        t.start()
        self._threads.append(t)
        log.info("liveness at http://0.0.0.0:%d/healthz", port)
