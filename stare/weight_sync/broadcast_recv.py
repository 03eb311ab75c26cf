"""Weight broadcast, the rollout workers' end (`broadcast.py` is the learner's; its docstring has the
protocol and the store keys).

A background thread per worker joins the learner's group and receives into a buffer set on the
communicator's device (CPU for gloo, the worker's GPU for NCCL): one contiguous buffer per segment,
every tensor a view. The version's layout comes from the store, so every receive is posted before
any is awaited and no received byte is read back on the host. At most two sets exist: the one the
rollout loop took last (`fetch`) and one being received; a version that arrives before the previous
one was taken overwrites it (the worker jumps to the newest anyway). The rollout loop takes the
newest between batches, so a learner broadcast never waits for a generation to finish.
`buffer_sets=1` (a worker that takes every version between two engine steps: in-flight weight
updates) keeps one set: a receive waits until the loop's next `fetch` has released the set it took
(one engine step, tens of milliseconds; at most `timeout_s`), and the GPU holds one copy of the model
for the weight sync instead of two (14 GiB at 7B, given to the KV cache). On a GPU the sets are fenced
by events (stare.weight_sync.streams): the engine's stream reads a set after its receive, and a receive
into a set waits, on the device, for the work the engine had enqueued when it released the set (its
next `fetch`), so a receive never overwrites a set the engine is still copying from and two versions
never mix. Workers
that see their generation dissolved, or lose the store (learner restart), or whose receive fails,
rejoin from scratch. A version is handed to the loop only once every one of its messages arrived: a
learner that dies mid-version leaves the loop the previous whole version, never part of a new one.

With `locate` (the run's Redis: rendezvous.py) a worker dials the store its run's learner announced,
joins it only if the store names that run and epoch, leaves it as soon as a newer epoch is announced,
and never goes back: its (epoch, generation) pairs only increase (`joined`), and an untaken version of
an older epoch is withdrawn when it joins a newer one.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from stare.weight_sync.buckets import Layout, Segments
from stare.weight_sync.communicator import (
    BuildCommunicator,
    Communicator,
    PointToPointGroup,
    Setting,
    build_communicator,
    check_setting,
    device_scope,
    nccl_gpu,
)
from stare.weight_sync.rendezvous import Locate, store_identity

log = logging.getLogger(__name__)

GENERATION_OVER = -1  # announced instead of a version: the generation ended, read `gen`


class BroadcastSubscriber:
    """Rollout side: joins the learner's group and receives every broadcast in a background thread;
    `fetch` hands the newest received version to the rollout loop."""

    def __init__(
        self,
        host: str,
        port: int,
        name: str,
        *,
        timeout_s: float = 30.0,
        poll_s: float = 0.05,
        wait_s: float = 1.0,
        communicator: Setting = "auto",
        buffer_sets: int = 2,
        communicators: BuildCommunicator = build_communicator,
        locate: Locate | None = None,
    ) -> None:
        check_setting(communicator)
        self._communicators = communicators
        if buffer_sets not in (1, 2):
            raise ValueError(f"buffer_sets must be 1 or 2, got {buffer_sets}")
        self.buffer_sets = buffer_sets
        self.host, self.port, self.name = host, port, name
        self.locate = locate  # where the run's learner announced its store (rendezvous.py); None: host:port
        self.epoch = -1  # the learner epoch of the store this worker is in (0: unannounced; -1: none yet)
        self.joined: deque[tuple[int, int]] = deque(maxlen=64)  # (epoch, generation) joined, in order
        self._latest_epoch = -1  # the epoch `_latest` came from
        self._next_look = 0.0  # when to read the announcement again while in a generation
        self._refused: set[tuple[str, int, object]] = set()  # stores already reported as not this run's
        self.timeout_s, self.poll_s, self.wait_s = timeout_s, poll_s, wait_s
        self._gpu = nccl_gpu(communicator)
        self._device = torch.device("cuda", torch.cuda.current_device()) if self._gpu else None  # the engine's
        self._lock = threading.Condition()
        self._latest: tuple[int, dict[str, torch.Tensor], Segments] | None = None
        self._in_use: Segments | None = None  # the buffer set the last fetch handed out
        self._pool: list[Segments] = []  # at most `buffer_sets` sets, on the current communicator's device
        self._layouts: dict[tuple[int, int, int], Layout] = {}
        self._stop = threading.Event()
        self.generations_joined = 0
        self.received = 0
        self.communicator: str | None = None  # of the generation joined last
        self._thread = threading.Thread(target=self._run, name=f"weights-{name}", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- WeightSubscriber
    def fetch(self, have_version: int) -> tuple[int, Mapping[str, torch.Tensor]] | None:
        """The newest version if newer than have_version. Its tensors stay valid (not overwritten by
        later broadcasts) until the next `fetch`. The caller reads them on its thread's current stream
        (vLLM's `reload_weights` does, in the engine's thread): that stream waits here for the receive,
        and the next `fetch` marks the set free after the work the caller has enqueued by then."""
        with self._lock:
            self._release()  # the caller is done with what it took before
            if self._latest is None or self._latest[0] <= have_version:
                return None
            version, state, buffers = self._latest
            self._in_use = buffers
            self._fence_read(buffers)
            return version, state

    def wait_for(self, min_version: int, timeout_s: float) -> bool:
        """Block until a version >= min_version has arrived (True) or timeout_s passed (False)."""
        with self._lock:
            return self._lock.wait_for(
                lambda: self._latest is not None and self._latest[0] >= min_version, timeout=timeout_s
            )

    def close(self) -> None:
        """Stop receiving; a receive in progress is abandoned (the thread is a daemon)."""
        self._stop.set()
        self._thread.join(timeout=2.0)

    # ---------------------------------------------------------------- fences (stare.weight_sync.streams)
    def _release(self) -> None:
        """The set handed out last is free once the caller's work enqueued so far is done."""
        if self._in_use is not None:
            self._in_use.free_after = self._in_use.streams.record()  # on the caller's (the engine's) stream
            self._in_use = None
            self._lock.notify_all()  # a receive waiting for that set (buffer_sets 1)

    @staticmethod
    def _fence_read(buffers: Segments) -> None:
        """The caller's stream reads `buffers` after their receive."""
        buffers.streams.wait(buffers.ready)

    @staticmethod
    def _fence_reuse(buffers: Segments) -> None:
        """The receive stream writes `buffers` after their last reader's work."""
        buffers.streams.wait(buffers.free_after)

    # ---------------------------------------------------------------- receiver thread
    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                target = self._target()
                if target is None:  # no learner announced yet (or only an older one): wait for it
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
                host, port, epoch = target
                # a plain connect first: fails fast (and quietly) while no learner listens
                socket.create_connection((host, port), timeout=2.0).close()
                store = dist.TCPStore(
                    host, port, is_master=False, timeout=timedelta(seconds=self.timeout_s), use_libuv=True
                )
                if epoch is not None and not self._is_announced_store(store, host, port, epoch):
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                self._enter_epoch(0 if epoch is None else epoch)
                backoff = 0.1
                while not self._stop.is_set():
                    self._serve_one_generation(store)
            except _Superseded as err:  # a newer learner announced itself: go to it now
                log.info("weight receiver %s: %s", self.name, err)
            except Exception as err:  # learner gone or restarting, or a receive failed: dial again
                if self._stop.is_set():
                    return
                log.info("weight receiver %s: %s; reconnecting in %.1fs", self.name, str(err).splitlines()[0], backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _target(self) -> tuple[str, int, int | None] | None:
        """(host, port, epoch) to dial: the announced rendezvous (never an epoch older than the one this
        worker is in), or the configured address without an announcement to check (epoch None)."""
        if self.locate is None:
            return self.host, self.port, None
        found = self.locate()
        if found is None or found.epoch < self.epoch:
            return None
        return found.host, found.port, found.epoch

    def _is_announced_store(self, store: Any, host: str, port: int, epoch: int) -> bool:
        """Whether the store at host:port is this run's learner of `epoch` (what was announced): not a
        store of another run, or of a learner whose port another process took after it died."""
        found = self.locate() if self.locate is not None else None
        identity = store_identity(store)
        if found is not None and identity == (found.run, epoch):
            return True
        if (host, port, identity) not in self._refused:
            self._refused.add((host, port, identity))
            says = "nothing about its run" if identity is None else f"run {identity[0]} epoch {identity[1]}"
            want = f"run {found.run} epoch {epoch}" if found is not None else f"epoch {epoch}"
            log.warning(
                "weight receiver %s: the store at %s:%d serves %s, not %s (announced in Redis): not joining it; "
                "waiting for this run's learner",
                self.name,
                host,
                port,
                says,
                want,
            )
        return False

    def _enter_epoch(self, epoch: int) -> None:
        """Joining the store of learner `epoch`: a version an older learner sent and the loop has not taken is
        withdrawn (that learner is gone; the new one publishes its own at once)."""
        with self._lock:
            if epoch > self.epoch and self._latest is not None and self._latest_epoch < epoch:
                self._latest = None
            self.epoch = max(self.epoch, epoch)

    def _check_superseded(self) -> None:
        """Raise _Superseded when a newer learner epoch was announced (read at most every wait_s)."""
        if self.locate is None or time.monotonic() < self._next_look:
            return
        self._next_look = time.monotonic() + max(self.wait_s, 0.5)
        found = self.locate()
        if found is not None and found.epoch > self.epoch:
            raise _Superseded(
                f"learner epoch {found.epoch} announced at {found.host}:{found.port}; leaving epoch {self.epoch}"
            )

    def _serve_one_generation(self, store: Any) -> None:
        """Ask to join, then receive in each generation that lists this worker; return when one
        leaves it out (dissolved) so the caller asks again."""
        asked_at = int(store.get("gen"))
        ticket = store.add("joins", 1)
        store.set(f"join/{ticket}/gpu", self._gpu or "")
        store.set(f"join/{ticket}", self.name)
        joined = self._await_membership(store, asked_at)
        while joined is not None and not self._stop.is_set():
            joined = self._receive(store, *joined)

    def _receive(self, store: Any, g: int, members: list[str]) -> tuple[int, list[str]] | None:
        """Receive generation g's broadcasts until the generation changes; the next generation if it
        lists this worker too (a member stays a member when others join), else None."""
        rank = members.index(self.name) + 1
        comm = self._communicators(store.get(f"gen/{g}/comm").decode(), self._device)
        pg = comm.group(store, g, rank, len(members) + 1, self.timeout_s)
        if self.locate is not None and self.joined and (self.epoch, g) <= self.joined[-1]:
            raise RuntimeError(f"weight generation {(self.epoch, g)} is not after {self.joined[-1]}: not joining")
        self.joined.append((self.epoch, g))
        stream = comm.streams.new_stream()  # the receives' stream (the group's own follows it)
        self.generations_joined += 1
        self.communicator = comm.name
        log.info(
            "weight receiver %s joined epoch %d generation %d (%s) as rank %d of %d",
            self.name,
            self.epoch,
            g,
            comm.name,
            rank,
            len(members) + 1,
        )
        seq = 0
        while not self._stop.is_set():
            self._check_superseded()
            key = f"gen/{g}/bcast/{seq}"
            try:  # blocks in the store (no polling traffic) until the learner announces the next one
                store.wait([key], timedelta(seconds=self.wait_s))
            except Exception:
                if not store.check([key]):
                    continue
            announced = store.get(key).decode().split()
            if int(announced[0]) == GENERATION_OVER:
                now = int(store.get("gen"))
                nxt = json.loads(store.get(f"gen/{now}/members"))
                return (now, nxt) if self.name in nxt else None
            version, layout_seq = int(announced[0]), int(announced[1])
            layout = self._layout(store, g, layout_seq)
            buffers = self._free_buffers(comm)
            with comm.streams.use(stream), device_scope(comm.device):
                self._fence_reuse(buffers)
                self._receive_segments(pg, buffers, layout)
                buffers.ready = comm.streams.record()
            state = buffers.tensors(layout)
            with self._lock:
                self._latest, self._latest_epoch = (version, state, buffers), self.epoch
                self.received += 1
                self._lock.notify_all()
            seq += 1
        return None

    @staticmethod
    def _receive_segments(pg: PointToPointGroup, buffers: Segments, layout: Layout) -> None:
        """Receive one version's messages into `buffers`: every receive posted (tag k: the k-th
        message, in the sender's order, as NCCL needs) before any is awaited; nothing is read back."""
        works = [pg.recv([target], 0, k) for k, target in enumerate(buffers.targets(layout))]
        for work in works:
            work.wait()

    def _layout(self, store: Any, g: int, layout_seq: int) -> Layout:
        key = (self.epoch, g, layout_seq)
        if key not in self._layouts:  # keep only the newest
            self._layouts = {key: Layout.from_json(json.loads(store.get(f"gen/{g}/layout/{layout_seq}")))}
        return self._layouts[key]

    def _free_buffers(self, comm: Communicator) -> Segments:
        """A buffer set to receive into: not the one handed out last; no set beyond `buffer_sets` is
        made: the newest complete version is overwritten instead (it is withdrawn first), and with one
        set a receive waits for the rollout loop to release it (RuntimeError after timeout_s)."""
        device = comm.device
        with self._lock:
            self._pool = [b for b in self._pool if b.device == device]
            for buffers in self._pool:
                buffers.streams = comm.streams  # this generation's (the same device: its events order the same work)
            if (
                self.buffer_sets == 1
                and self._pool
                and self._pool[0] is self._in_use
                and not self._lock.wait_for(
                    lambda: self._in_use is not self._pool[0] or self._stop.is_set(), timeout=self.timeout_s
                )
            ):
                raise RuntimeError(
                    f"weight receiver {self.name}: the rollout loop kept the weights it took for "
                    f"{self.timeout_s:.0f} s (one receive buffer set: it must fetch between steps)"
                )
            latest = self._latest[2] if self._latest else None
            for buffers in self._pool:
                if buffers is not self._in_use and buffers is not latest:
                    return buffers
            if len(self._pool) < self.buffer_sets:
                self._pool.append(Segments(device, comm.streams))
                return self._pool[-1]
            if latest is None:  # one set, still taken: the wait above ended because the receiver is stopping
                raise RuntimeError(f"weight receiver {self.name}: stopped while the rollout loop held the weights")
            self._latest = None  # superseded before it was taken: its buffers take the newer version
            assert latest is not None, "every set is in use"  # buffer_sets sets: one handed out, one the newest
            return latest

    def _await_membership(self, store: dist.Store, asked_at: int) -> tuple[int, list[str]] | None:
        """Wait (polling) for the first generation newer than `asked_at`: this worker's rank in it,
        or None if it left this worker out (a failed formation, or it read the joins before ours)."""
        while not self._stop.is_set():
            self._check_superseded()
            g = int(store.get("gen"))
            if g > asked_at:
                members = json.loads(store.get(f"gen/{g}/members"))
                return (g, members) if self.name in members else None
            self._stop.wait(self.poll_s)
        return None


class _Superseded(Exception):
    """A newer learner epoch was announced: leave the current store."""
