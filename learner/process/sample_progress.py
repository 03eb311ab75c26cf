"""The node-colocated SAMPLE op's progress (learner/process/colocation.py): heartbeats instead of one silent
wait, and a limit from the decode rate instead of a fixed minute. The EVALUATE op shows its progress on the
same board (`beating`: a rank alive in one long call, bounded by task.eval_timeout_s).

Every rank samples until the prompt stream is empty; the op then gathers every rank's report. The gather
used to be the only wait, bounded by the rank channel's timeout (the stall limit, at least 60 s): a rank
sampling 15,360-token responses could run past it. Now each rank shows its progress on a board
(`StoreBoard`, in the learner's torch.distributed store) every few seconds while it samples, and every rank
waits on the board before the gather: a rank whose progress stops for the stall limit fails the op, and so
does a rank whose sampling runs past its own limit (`DecodeMeter`: the time between two finished groups, at
most SAMPLE_SLACK x max_new_tokens / its measured engine steps per second + the stall limit). One rank, or a
simulation, uses `LocalBoard` (no one to wait for).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

log = logging.getLogger(__name__)

SAMPLE_SLACK = 2.0  # x the time a whole response takes at the measured step rate
BEAT_S = 2.0  # a rank's progress written at most this often


class DecodeMeter:
    """One rank's sampling in a SAMPLE op: engine steps, groups finished, and the limit on the time between
    two finished groups: SAMPLE_SLACK x max_new_tokens / (the op's measured engine steps per second) +
    `floor_s` (a running sequence ends within max_new_tokens steps; vLLM's preemption aside). Before a rate is
    measured (`min_steps` steps) the limit is `floor_s`."""

    def __init__(
        self, max_new_tokens: int, floor_s: float, *, min_steps: int = 8, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_new_tokens, self.floor_s, self.min_steps, self.clock = max_new_tokens, floor_s, min_steps, clock
        self.start = self.last_group = self.last_step = clock()
        self.steps = self.groups = 0

    def restart(self) -> None:
        """Sampling starts now (after the engine's wake and weights): the clocks start here."""
        self.start = self.last_group = self.last_step = self.clock()
        self.steps = 0

    def step(self, groups: int = 0, steps: int = 1) -> None:
        """One engine step (`steps` 0: a batch call whose steps are not counted) that finished `groups`."""
        now = self.clock()
        if steps:
            self.steps += steps
            self.last_step = now
        if groups:
            self.groups += groups
            self.last_group = now

    @property
    def steps_per_s(self) -> float | None:
        """Engine steps per second of this op, up to its last step (a pause without steps is the board's
        stall window to judge, not a lower rate)."""
        elapsed = self.last_step - self.start
        return self.steps / elapsed if self.steps >= self.min_steps and elapsed > 0 else None

    @property
    def limit_s(self) -> float:
        rate = self.steps_per_s
        return self.floor_s + (SAMPLE_SLACK * self.max_new_tokens / rate if rate else 0.0)

    def overdue(self) -> str | None:
        """Why this rank's sampling has run past its limit (None: it has not)."""
        waited = self.clock() - self.last_group
        if waited <= self.limit_s:
            return None
        rate = self.steps_per_s
        return (
            f"no group finished for {waited:.0f} s, over the limit {self.limit_s:.0f} s (= {SAMPLE_SLACK:g} x "
            f"max_new_tokens {self.max_new_tokens} / {rate or 0:.1f} engine steps/s + {self.floor_s:.0f} s)"
        )

    def report(self, done: bool = False, failed: str | None = None) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "groups": self.groups,
            "limit_s": round(self.limit_s, 1),
            "steps_per_s": self.steps_per_s,
            "done": done,
            "failed": failed,
        }


class SampleBoard(Protocol):
    """Where the ranks of a SAMPLE op show their progress and wait for one another before the op's gather."""

    def begin(self, op: str = "SAMPLE") -> None:
        """A new op on this rank (SAMPLE, or the held-out evaluation's EVALUATE)."""
        ...

    def beat(self, report: dict[str, Any], force: bool = False) -> None:
        """This rank's `DecodeMeter.report()` (written at most every BEAT_S unless `force`, done or failed)."""
        ...

    def wait_all(self) -> None: ...


class LocalBoard:
    """One rank (or a simulation): nobody to wait for."""

    def begin(self, op: str = "SAMPLE") -> None:
        pass

    def beat(self, report: dict[str, Any], force: bool = False) -> None:
        pass

    def wait_all(self) -> None:
        pass


class StoreBoard:
    """The ranks' progress in a torch.distributed store (the default group's: every rank reaches it). Each
    SAMPLE op is numbered by the rank's own count of them (every rank runs the same ops). `wait_all` returns
    once every rank is done, and raises naming the rank when one failed (its limit), or when its progress has
    not changed for `stall_s` (the process hung or died); rank 0 logs everyone's progress every `say_every_s`."""

    def __init__(
        self,
        store,
        rank: int,
        world: int,
        *,
        stall_s: float,
        poll_s: float = 0.5,
        say_every_s: float = 30.0,
        say: Callable[[str], None] = log.info,
    ):
        self.store, self.rank, self.world = store, rank, world
        self.stall_s, self.poll_s, self.say_every_s, self.say = stall_s, poll_s, say_every_s, say
        self.op, self.name = 0, "SAMPLE"
        self._last_beat = 0.0

    @classmethod
    def on_default_group(cls, rank: int, world: int, **kwargs: Any) -> StoreBoard:
        """A board in the store of this process's default torch.distributed group (the learner's)."""
        import torch.distributed as dist

        return cls(dist.PrefixStore("stare/sample", dist.distributed_c10d._get_default_store()), rank, world, **kwargs)

    def begin(self, op: str = "SAMPLE") -> None:
        self.op, self.name = self.op + 1, op
        self._last_beat = 0.0
        if self.op > 2:  # the op before the previous one is over on every rank
            for r in range(self.world):
                self.store.delete_key(f"{self.op - 2}/{r}")

    def beat(self, report: dict[str, Any], force: bool = False) -> None:
        now = time.monotonic()
        if force or report.get("done") or report.get("failed") or now - self._last_beat >= BEAT_S:
            self.store.set(f"{self.op}/{self.rank}", json.dumps(report))
            self._last_beat = now

    def wait_all(self) -> None:
        said = start = time.monotonic()
        seen = dict.fromkeys(range(self.world), ("", start))  # rank -> (its last report, when it changed here)
        while True:
            now, reports = time.monotonic(), {}
            for r in range(self.world):
                key = f"{self.op}/{r}"
                raw = self.store.get(key).decode() if self.store.check([key]) else ""
                if seen[r][0] != raw:
                    seen[r] = (raw, now)
                reports[r] = json.loads(raw) if raw else {}
            failed = {r: p["failed"] for r, p in reports.items() if p.get("failed")}
            if failed:
                raise RuntimeError(
                    f"{self.name} op: " + "; ".join(f"learner rank {r}: {why}" for r, why in failed.items())
                )
            if all(p.get("done") for p in reports.values()):
                return
            stalled = [r for r, (_, t) in seen.items() if not reports[r].get("done") and now - t > self.stall_s]
            if stalled:
                raise RuntimeError(
                    f"{self.name} op: learner rank(s) {stalled} showed no progress for {self.stall_s:.0f} s "
                    "(hung or dead); the learner restarts as a whole"
                )
            if self.rank == 0 and now - said >= self.say_every_s:
                said = now
                self.say(
                    f"{self.name} op {now - start:.0f} s: "
                    + ", ".join(f"rank {r} {progress_of(p)}" for r, p in reports.items())
                )
            time.sleep(self.poll_s)


def progress_of(report: dict[str, Any]) -> str:
    """A rank's part of rank 0's progress line: a SAMPLE op's groups and decode steps (`DecodeMeter.report`),
    or the seconds of a `beating` block (the EVALUATE op's generate calls), or nothing reported yet."""
    limit = f"limit {report.get('limit_s', '?')} s"
    state = "done" if report.get("done") else report.get("what", "sampling")
    if "groups" in report:
        return f"{state} ({report['groups']} groups, {report.get('steps', 0)} steps, {limit})"
    if "seconds" in report:
        return f"{state} ({report['seconds']:.0f} s, {limit})"
    return "nothing reported yet"


@contextmanager
def beating(
    board: SampleBoard,
    *,
    limit_s: float,
    what: str,
    every_s: float = BEAT_S / 2,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[None]:
    """Progress on `board` while the block runs one long call that cannot beat itself (an evaluation's
    `generate`): a beat every `every_s` from a thread, each one new (its seconds so far), so the other ranks'
    `wait_all` sees this rank alive; past `limit_s` the beat says failed (their `wait_all` raises, the op
    fails on every rank; this rank's own call is not interrupted, and when it returns this rank raises too,
    its board still saying failed). Done when the block ends in time, failed if it raised."""
    start, stop, overrun = clock(), threading.Event(), []

    def report(**extra: Any) -> dict[str, Any]:
        seconds = round(clock() - start, 1)
        return {"what": what, "seconds": seconds, "limit_s": limit_s, "done": False, "failed": None, **extra}

    def beat() -> None:
        while not stop.wait(every_s):
            waited = clock() - start
            if waited > limit_s:
                overrun.append(f"{what}: still running after {waited:.0f} s, over the limit {limit_s:.0f} s")
                board.beat(report(failed=overrun[0]), force=True)
                return
            board.beat(report(), force=True)

    board.beat(report(), force=True)
    thread = threading.Thread(target=beat, name="op-beat", daemon=True)
    thread.start()
    try:
        yield
    except BaseException as err:
        stop.set()
        thread.join()
        board.beat(report(failed=overrun[0] if overrun else f"{what}: {type(err).__name__}: {err}"), force=True)
        raise
    stop.set()
    thread.join()
    if overrun:  # the call returned after the others were told the op failed: it failed here too
        board.beat(report(failed=overrun[0]), force=True)
        raise RuntimeError(overrun[0])
    board.beat(report(done=True), force=True)
