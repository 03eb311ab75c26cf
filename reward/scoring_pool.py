"""Run CPU-heavy verification off the event loop, in worker processes with a hard timeout.

`ScoringPool` keeps `workers` processes (started with "forkserver", so no event-loop threads are
forked); `await pool.score(fn, *args)` sends `fn(*args)` to an idle worker and waits for it
without blocking the loop. Whatever happens, the caller gets a `RewardResult`:
- `fn` returns a float or a RewardResult: that (a float becomes `RewardResult(reward=x)`);
- `fn` raises: reward 0.0, error "ExcType: message";
- the item runs past its timeout: the worker is killed (SIGKILL) and replaced; reward 0.0, error
  "timed out after N s";
- the worker dies (os._exit, a segfault, the OOM killer): it is replaced; reward 0.0, error
  "worker died (exit code N)".
Later items are unaffected. This is the hard bound that in-thread timeouts cannot give (a long C
call, a runaway allocation): use it around `compute_reward` or `check_math`.

A worker runs `preload` imports and the `initializer` before it answers "ready"; an item's time
limit starts once its worker is ready (up to `start_timeout_s`), so slow imports (a user's reward
module) are not charged to the first item. An initializer that raises is reported by nothing but the
items that follow (they fail as the initializer would have).

Limits: `fn` and its arguments must be picklable (module-level functions); each item pays a
pickle round trip (~0.1 ms); a replaced worker pays its start-up again (with `preload`, the
imports too, ~1 s for math-verify). Worker memory is not limited here (set an address-space limit
with `memory_mb`, applied in each worker with RLIMIT_AS).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import multiprocessing
import resource
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from reward.verifiers.compose import RewardResult


class ScoringPoolConfig(BaseModel):
    """Size, time budget and start-up of the scoring workers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int = Field(2, ge=1, le=512)
    """Worker processes (items scored at once)."""
    timeout_s: float = Field(30.0, gt=0, le=3600)
    """Default seconds per item before its worker is killed."""
    start_method: Literal["forkserver", "spawn"] = "forkserver"
    """How workers start; both are safe in a threaded, event-loop process."""
    preload: tuple[str, ...] = ()
    """Modules each worker imports at start (e.g. "stare.data.tasks.math_verify")."""
    memory_mb: int | None = Field(None, ge=64, le=1 << 20)
    """Address-space limit per worker (RLIMIT_AS), None for none."""
    initializer: Callable[..., Any] | None = None
    """A module-level function each worker calls once, with `initargs`, before it takes work."""
    initargs: tuple[Any, ...] = ()
    start_timeout_s: float = Field(300.0, gt=0, le=3600)
    """Seconds a new worker may take to get ready (imports, initializer); past it the item it was
    given fails ('did not start') and the worker is replaced."""


def _worker_main(
    conn: Connection,
    preload: tuple[str, ...],
    memory_mb: int | None,
    initializer: Callable[..., Any] | None = None,
    initargs: tuple[Any, ...] = (),
) -> None:
    """Worker loop: get ready (limits, imports, initializer; then say "ready"), then receive
    (fn, args, kwargs) and send ("ok", value) or ("error", text)."""
    if memory_mb is not None:
        limit = memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for module in preload:
        importlib.import_module(module)
    if initializer is not None:
        with contextlib.suppress(Exception):  # the items report what fails here
            initializer(*initargs)
    conn.send(("ready", None))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        fn, args, kwargs = task
        try:
            reply = ("ok", fn(*args, **kwargs))
        except BaseException as exc:
            reply = ("error", f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except Exception as exc:
            conn.send(("error", f"result could not be sent back: {type(exc).__name__}: {exc}"))


class _Worker:
    def __init__(self, ctx, config: ScoringPoolConfig):
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(
            target=_worker_main,
            args=(child, config.preload, config.memory_mb, config.initializer, config.initargs),
            daemon=True,
        )
        self.process.start()
        child.close()
        self.ready = False  # until its "ready" message is read (ScoringPool._call)

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class ScoringPool:
    """A fixed-size pool of scoring processes; see the module docstring for the guarantees.

    Use as `async with ScoringPool(config) as pool: await pool.score(fn, *args)`. `score` may be
    called concurrently; items beyond `workers` wait for a free worker.
    """

    def __init__(self, config: ScoringPoolConfig | None = None):
        self.config = config or ScoringPoolConfig()
        self._ctx = multiprocessing.get_context(self.config.start_method)
        self._idle: asyncio.Queue[_Worker] | None = None
        self._all: set[_Worker] = set()
        self._closed = False
        self.restarts = 0
        """Workers replaced after a crash or timeout (a metric)."""

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._idle = asyncio.Queue()
        for _ in range(self.config.workers):
            self._put(await loop.run_in_executor(None, _Worker, self._ctx, self.config))

    async def close(self) -> None:
        """Stop every worker (idle ones politely, busy ones are killed by their `score`)."""
        self._closed = True
        workers, self._all = self._all, set()
        loop = asyncio.get_running_loop()
        for worker in workers:
            with contextlib.suppress(Exception):
                worker.conn.send(None)
        for worker in workers:
            await loop.run_in_executor(None, worker.process.join, 2.0)
            worker.kill()

    @property
    def pids(self) -> list[int]:
        """Process ids of the current workers (for metrics and debugging)."""
        return sorted(w.process.pid for w in self._all if w.process.pid is not None)

    async def __aenter__(self) -> ScoringPool:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _put(self, worker: _Worker) -> None:
        self._all.add(worker)
        assert self._idle is not None
        self._idle.put_nowait(worker)

    async def score(
        self, fn: Callable[..., float | RewardResult], /, *args, timeout_s: float | None = None, **kwargs
    ) -> RewardResult:
        """`fn(*args, **kwargs)` in a worker, as a RewardResult; never raises for what fn does."""
        if self._idle is None:
            raise RuntimeError("ScoringPool.score before start(); use `async with ScoringPool()`")
        timeout = timeout_s if timeout_s is not None else self.config.timeout_s
        worker = await self._idle.get()
        healthy = False
        try:
            outcome = await self._call(worker, fn, args, kwargs, timeout)
            healthy = outcome[0] != "dead"
        finally:
            if healthy and not self._closed:
                self._idle.put_nowait(worker)
            else:  # dead, hung, cancelled, or pool closed
                self._all.discard(worker)
                await self._replace(worker)
        return _to_result(outcome)

    async def _call(self, worker: _Worker, fn, args, kwargs, timeout: float) -> tuple[str, object]:
        if not worker.ready:  # its start-up is not charged to the item
            started = await self._reply(worker, self.config.start_timeout_s)
            if started[0] != "ready":
                if started[1].startswith("timed out"):
                    return ("dead", f"worker did not start within {self.config.start_timeout_s:g} s")
                return started
            worker.ready = True
        try:
            worker.conn.send((fn, args, kwargs))
        except Exception as exc:
            if not worker.process.is_alive():
                return ("dead", f"worker died (exit code {worker.process.exitcode})")
            return ("error", f"task could not be sent: {type(exc).__name__}: {exc}")
        return await self._reply(worker, timeout)

    async def _reply(self, worker: _Worker, timeout: float) -> tuple[str, Any]:
        """The worker's next message, or ("dead", why) when it times out or dies first."""
        loop = asyncio.get_running_loop()
        ready = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        fds = (worker.conn.fileno(), worker.process.sentinel)
        for fd in fds:
            loop.add_reader(fd, wake)
        try:
            await asyncio.wait_for(ready, timeout)
        except TimeoutError:
            return ("dead", f"timed out after {timeout:g} s")
        finally:
            for fd in fds:
                loop.remove_reader(fd)
        if worker.conn.poll():
            try:
                return worker.conn.recv()
            except (EOFError, OSError):
                pass
        await loop.run_in_executor(None, worker.process.join, 1.0)
        return ("dead", f"worker died (exit code {worker.process.exitcode})")

    async def _replace(self, worker: _Worker) -> None:
        """Kill `worker`; start a new one in its place unless the pool is closed."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, worker.kill)
        if not self._closed:
            self.restarts += 1
            self._put(await loop.run_in_executor(None, _Worker, self._ctx, self.config))


def _to_result(outcome: tuple[str, object]) -> RewardResult:
    kind, value = outcome
    if kind == "ok":
        if isinstance(value, RewardResult):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return RewardResult(reward=float(value))
        return RewardResult(
            reward=0.0, error=f"verifier returned {type(value).__name__}, expected float or RewardResult"
        )
    return RewardResult(reward=0.0, error=str(value))
