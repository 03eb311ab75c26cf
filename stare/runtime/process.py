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
derived from `system.stall_s` (docs/deploy.md).

Worker names: `--name`, else STARE_WORKER_NAME, else `<role>-<host>-<pid>`. A name is the
worker's stream consumer name: a worker restarted under the same name first re-reads what it held.
A name with `{slot}` (compose's replicas: STARE_WORKER_NAME=rollout-cpu-{slot}) takes the lowest
slot 1, 2, ... whose worker is not alive (stopped, dead, forgotten) or ran on this same host (the
container restarted), reserved in Redis for `dead_after_s` so replicas starting together differ:
a redeployed replica takes its predecessor's name and pending entries. On a clean exit a role
sends a last `gone` heartbeat; /v1/status lists it as gone (not alive) until `forget_after_s`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from stare.config import ConfigError, TrainConfig, staleness

log = logging.getLogger(__name__)


SLOT = "{slot}"
MAX_SLOTS = 4096


def worker_name(role: str, name: str | None) -> str:
    return name or os.environ.get("STARE_WORKER_NAME") or f"{role}-{socket.gethostname()}-{os.getpid()}"


def claim_slot(state, role: str, template: str, *, host: str, ttl_s: float) -> str:
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
    """worker_name(), with a `{slot}` in it claimed in the run's Redis state."""
    name = worker_name(role, name)
    if SLOT not in name:
        return name
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


def connect_transport(cfg: TrainConfig, url: str):
    """The run's three Redis streams with the options every role uses: the scored stream also
    holds what the learner trained since its last checkpoint (acknowledged then), so its backlog
    bound and MAXLEN leave room for that."""
    from stare.transport.redis_transport import RedisTransport

    s = cfg.system
    backlog = stream_backlog(cfg)
    return RedisTransport.connect(
        url,
        cfg.run.name,
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


MIN_PROGRESS_CPU_S = 0.01
"""CPU seconds a busy thread must use between two looks to count as making progress (a blocked
thread uses none; a heartbeat interval of real work uses far more)."""


def _thread_cpu_s(ident: int) -> float | None:
    """CPU seconds thread `ident` (threading.get_ident()) has used; None where the OS has no
    per-thread CPU clock (then only explicit ticks keep a busy role alive)."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident))
    except (AttributeError, OSError):
        return None


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
        self.stall_s = stall_s if stall_s is not None else cfg.system.stall_s
        self._busy: tuple[str, int, float] | None = None  # (what, thread id, its CPU time when last seen)
        self._busy_lock = threading.Lock()
        self.state = RedisRunState.connect(
            url, cfg.run.name, dead_after_s=cfg.system.dead_after_s, forget_after_s=cfg.system.forget_after_s
        )
        self.steering = RunSteering(self.state, role=role, name=name, heartbeat_s=cfg.system.heartbeat_s)
        self.info: dict[str, Any] = {}
        self.last_tick = time.monotonic()
        self._threads: list[threading.Thread] = []
        self._http: ThreadingHTTPServer | None = None

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> RoleRuntime:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        beat = threading.Thread(target=self._beat_loop, name="heartbeat", daemon=True)
        beat.start()
        self._threads.append(beat)
        watcher = threading.Thread(target=self._watch_signals, name="signals", daemon=True)
        watcher.start()
        self._threads.append(watcher)
        port = int(os.environ.get("STARE_HEALTH_PORT", self.cfg.system.health_port))
        if port:
            self._serve_health(port)
        log.info("%s %s started (pid %d)", self.role, self.name, os.getpid())
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        for t in self._threads:
            t.join(timeout=5)
        try:  # after the heartbeat thread ended: nothing beats after this one
            self.steering.heartbeat(info=self.info, gone=True)
        except Exception as err:  # Redis gone too: the beat ages into "dead", then is forgotten
            log.warning("could not record the exit in Redis: %s", err)
        log.info("%s %s stopped", self.role, self.name)

    def _on_signal(self, signum, frame) -> None:
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
        self.last_tick = time.monotonic()
        self.info.update(info)

    def healthy(self) -> bool:
        self._watch_busy()
        return time.monotonic() - self.last_tick < self.stall_s

    @contextlib.contextmanager
    def busy(self, what: str) -> Iterator[None]:
        """Long work on the calling thread: liveness stays fresh while this thread uses CPU (or
        ticks); a hung one is reported after `stall_s`. Nests (the outermost is watched)."""
        if self._busy is not None:
            yield
            return
        self.tick(busy=what)
        with self._busy_lock:
            self._busy = (what, threading.get_ident(), _thread_cpu_s(threading.get_ident()))
        try:
            yield
        finally:
            with self._busy_lock:
                self._busy = None
            self.info.pop("busy", None)
            self.tick()

    def _watch_busy(self) -> None:
        """A busy thread whose CPU time grew since it was last seen is making progress: tick."""
        with self._busy_lock:
            if self._busy is None:
                return
            what, ident, seen = self._busy
            now = _thread_cpu_s(ident)
            if now is not None and seen is not None and now - seen >= MIN_PROGRESS_CPU_S:
                self._busy = (what, ident, now)
                self.last_tick = time.monotonic()

    def _beat_loop(self) -> None:
        while True:
            try:
                self.steering.heartbeat(info={**self.info, "healthy": self.healthy()}, force=True)
            except Exception as err:  # Redis restarting: the next beat retries
                log.warning("heartbeat failed: %s", err)
            if self.stop.wait(self.cfg.system.heartbeat_s):
                return

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

            def log_message(self, *args) -> None:
                pass

        self._http = ThreadingHTTPServer(("0.0.0.0", port), Handler)
        self._http.timeout = 5
        t = threading.Thread(target=self._http.serve_forever, name="healthz", daemon=True)
        t.start()
        self._threads.append(t)
        log.info("liveness at http://0.0.0.0:%d/healthz", port)
