"""Weight broadcast over a collective group formed at run time (gloo on CPU, NCCL on GPU).

The learner hosts a `TCPStore`; rollout workers dial it and ask to join. Membership changes only
between steps: at each `publish` (and each `serve_joiners`, called while the learner waits for
data) the learner admits the workers that asked, forms a fresh process group for the new
membership (generation g: `ProcessGroupGloo(PrefixStore("pg/g", store), rank, size, timeout)`;
`dist.new_group` cannot add processes) and broadcasts the weights to it. A worker receives in a background thread into its own buffers; the rollout
loop takes the newest version between batches (`fetch`), so a worker that missed versions jumps
to the newest, and a learner broadcast never waits for a generation to finish. Tensors go one by one
in layout order, all issued at once and then awaited (gloo pipelines them), one send per member
and tensor (what a one-to-all broadcast does anyway, with failures isolated per member); receivers write into
a small pool of preallocated buffer sets (one being received, the newest complete one, the one
the rollout loop is copying from), so no version costs fresh allocations.

Failure: the learner sends each tensor to each member on its own (all sends issued, then awaited),
so a dead worker fails only its own sends (within `timeout_s` for a stalled one): the others get
the whole version, the learner carries on, and the lost member is left out until the next
generation (it rejoins when it comes back). A joiner that dies before the group forms makes the
formation fail within `timeout_s`; that generation is dissolved and every member asks again. Workers that see their generation dissolved, or lose
the store (learner restart), rejoin from scratch.

Store keys: `joins` (counter), `join/<n>` (worker name), `gen` (current generation),
`gen/<g>/members` (JSON list, rank = index + 1), `gen/<g>/layout` (names, shapes, dtypes),
`gen/<g>/bcast/<seq>` (the version the seq-th broadcast carries), `version` (newest published).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

GENERATION_OVER = -1  # announced instead of a version: the generation ended, read `gen`
_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32)}


def _layout(state_dict: Mapping[str, torch.Tensor]) -> list[tuple[str, list[int], str]]:
    return [(name, list(t.shape), str(t.dtype)) for name, t in state_dict.items()]


def _gloo_group(store: dist.Store, generation: int, rank: int, size: int, timeout_s: float):
    prefix = dist.PrefixStore(f"pg/{generation}", store)
    return dist.ProcessGroupGloo(prefix, rank, size, timedelta(seconds=timeout_s))


class BroadcastPublisher:
    """Learner side: hosts the rendezvous and broadcasts each new version to the current members."""

    def __init__(self, host: str, port: int, *, timeout_s: float = 30.0):
        self.timeout_s = timeout_s
        self.store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=timeout_s), use_libuv=True)
        self.store.set("gen", "0")
        self.store.set("version", "-1")
        self.generation = 0
        self.members: list[str] = []  # the current generation, rank = index + 1
        self._lost: set[str] = set()  # members whose sends failed: skipped until the next generation
        self._pg = None
        self._seq = 0
        self._joins_seen = 0
        self._layout_json: str | None = None
        self.version = -1
        self.failures = 0

    # ---------------------------------------------------------------- API
    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Broadcast `version` to every member, admitting new joiners first. Never raises for a
        worker's failure: the generation is dissolved and the members rejoin."""
        if version <= self.version:
            raise ValueError(f"weight version must increase: got {version} after {self.version}")
        joiners = self._new_joiners()
        if joiners or (self._pg is None and self.members):
            self._form(self.alive_members + [j for j in joiners if j not in self.alive_members], state_dict)
        if self._pg is not None:
            self._broadcast(version, state_dict)
        self.version = version
        self.store.set("version", str(version))

    def serve_joiners(self, version: int, state_fn) -> bool:
        """Between steps (the learner waiting for data): admit workers that asked to join and send
        them the current weights (`state_fn()` builds the state dict only then). True if it did."""
        joiners = self._new_joiners()
        if not joiners:
            return False
        state_dict = state_fn()
        self._form(self.alive_members + joiners, state_dict)
        if self._pg is not None:
            self._broadcast(version, state_dict)
        return True

    def close(self) -> None:
        self._dissolve("learner closing")
        self._pg = None

    @property
    def alive_members(self) -> list[str]:
        return [m for m in self.members if m not in self._lost]

    # ---------------------------------------------------------------- internals
    def _new_joiners(self) -> list[str]:
        count = self.store.add("joins", 0)
        names = []
        for n in range(self._joins_seen + 1, count + 1):
            name = self.store.get(f"join/{n}").decode()
            if name not in self.alive_members and name not in names:  # a lost member may come back
                names.append(name)
        self._joins_seen = count
        return names

    def _end_generation(self, generation: int, seq: int) -> None:
        """Wake generation's members (blocked waiting for broadcast seq) to read the new `gen`;
        called after `gen` moved on."""
        self.store.set(f"gen/{generation}/bcast/{seq}", str(GENERATION_OVER))

    def _form(self, members: list[str], state_dict: Mapping[str, torch.Tensor]) -> None:
        old = (self.generation, self._seq)
        self.generation += 1
        g = self.generation
        self._layout_json = json.dumps(_layout(state_dict))
        self.store.set(f"gen/{g}/layout", self._layout_json)
        self.store.set(f"gen/{g}/members", json.dumps(members))
        self.store.set("gen", str(g))
        self._end_generation(*old)
        self._seq = 0
        t0 = time.perf_counter()
        try:
            self._pg = _gloo_group(self.store, g, 0, len(members) + 1, self.timeout_s)
        except Exception as err:  # a joiner died before connecting: drop the generation
            self.failures += 1
            log.warning("weight group generation %d (%d workers) did not form: %s; members must rejoin", g,
                        len(members), err)
            self._dissolve(f"formation failed: {err}")
            return
        self.members, self._lost = members, set()
        log.info("weight group generation %d formed with %d workers in %.2fs: %s", g, len(members),
                 time.perf_counter() - t0, members)

    def _broadcast(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        g, seq = self.generation, self._seq
        layout = json.loads(self._layout_json) if self._layout_json else []
        if [tuple(x) for x in layout] != [(n, s, d) for n, s, d in _layout(state_dict)]:
            self._form(self.alive_members, state_dict)  # a new layout: a new generation carries it
            if self._pg is None:
                return
            g, seq = self.generation, self._seq
        self.store.set(f"gen/{g}/bcast/{seq}", str(version))
        tensors = [state_dict[name].detach().cpu().contiguous() for name, _, _ in json.loads(self._layout_json)]
        # One send per (member, tensor), all issued before any is awaited: a member that died or
        # stalls past the timeout fails only its own sends; the others get the whole version.
        works: dict[int, list] = {}
        lost: dict[str, str] = {}
        for rank, name in enumerate(self.members, start=1):
            if name in self._lost:
                continue
            try:
                works[rank] = [self._pg.send([t], rank, tag) for tag, t in enumerate(tensors)]
            except Exception as err:  # noqa: BLE001 - gloo raises RuntimeError subclasses
                lost[name] = str(err).splitlines()[0]
        for rank, rank_works in works.items():
            try:
                for work in rank_works:
                    work.wait()
            except Exception as err:  # noqa: BLE001
                lost[self.members[rank - 1]] = str(err).splitlines()[0]
        self._seq += 1
        if lost:
            self.failures += 1
            self._lost.update(lost)
            log.warning("weight version %d did not reach %s: %s; the other %d members have it", version,
                        sorted(lost), "; ".join(lost.values()), len(self.alive_members))
            if not self.alive_members:
                self._dissolve(f"every member failed: {lost}")

    def _dissolve(self, reason: str) -> None:
        """End the current generation: an empty one replaces it and every worker rejoins."""
        old = (self.generation, self._seq)
        self._pg = None
        self.members, self._lost = [], set()
        self.generation += 1
        self._seq = 0
        self.store.set(f"gen/{self.generation}/members", "[]")
        self.store.set(f"gen/{self.generation}/reason", reason)
        self.store.set("gen", str(self.generation))
        self._end_generation(*old)


class BroadcastSubscriber:
    """Rollout side: joins the learner's group and receives every broadcast in a background thread;
    `fetch` hands the newest received version to the rollout loop."""

    def __init__(self, host: str, port: int, name: str, *, timeout_s: float = 30.0, poll_s: float = 0.05,
                 wait_s: float = 1.0):
        self.host, self.port, self.name = host, port, name
        self.timeout_s, self.poll_s, self.wait_s = timeout_s, poll_s, wait_s
        self._lock = threading.Condition()
        self._latest: tuple[int, dict[str, torch.Tensor]] | None = None
        self._in_use: dict[str, torch.Tensor] | None = None  # what the last fetch handed out
        self._pool: list[dict[str, torch.Tensor]] = []  # buffer sets of the current layout
        self._stop = threading.Event()
        self.generations_joined = 0
        self.received = 0
        self._thread = threading.Thread(target=self._run, name=f"weights-{name}", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- WeightSubscriber
    def fetch(self, have_version: int) -> tuple[int, Mapping[str, torch.Tensor]] | None:
        """The newest version if newer than have_version. Its tensors stay valid (not overwritten by
        later broadcasts) until the next `fetch`."""
        with self._lock:
            if self._latest is None or self._latest[0] <= have_version:
                return None
            self._in_use = self._latest[1]
            return self._latest

    def wait_for(self, min_version: int, timeout_s: float) -> bool:
        """Block until a version >= min_version has arrived (True) or timeout_s passed (False)."""
        with self._lock:
            return self._lock.wait_for(lambda: self._latest is not None and self._latest[0] >= min_version,
                                       timeout=timeout_s)

    def close(self) -> None:
        """Stop receiving; a receive in progress is abandoned (the thread is a daemon)."""
        self._stop.set()
        self._thread.join(timeout=2.0)

    # ---------------------------------------------------------------- receiver thread
    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                # a plain connect first: fails fast (and quietly) while no learner listens
                socket.create_connection((self.host, self.port), timeout=2.0).close()
                store = dist.TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=self.timeout_s),
                                      use_libuv=True)
                backoff = 0.1
                while not self._stop.is_set():
                    self._serve_one_generation(store)
            except Exception as err:  # learner gone or restarting: dial again
                if self._stop.is_set():
                    return
                log.info("weight receiver %s: %s; reconnecting in %.1fs", self.name, str(err).splitlines()[0], backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _serve_one_generation(self, store) -> None:
        """Ask to join, then receive in each generation that lists this worker; return when one
        leaves it out (dissolved) so the caller asks again."""
        asked_at = int(store.get("gen"))
        ticket = store.add("joins", 1)
        store.set(f"join/{ticket}", self.name)
        joined = self._await_membership(store, asked_at)
        while joined is not None and not self._stop.is_set():
            joined = self._receive(store, *joined)

    def _receive(self, store, g: int, members: list[str]) -> tuple[int, list[str]] | None:
        """Receive generation g's broadcasts until the generation changes; the next generation if it
        lists this worker too (a member stays a member when others join), else None."""
        rank = members.index(self.name) + 1
        layout = [tuple(x) for x in json.loads(store.get(f"gen/{g}/layout"))]
        if self._pool and [(n, list(t.shape), str(t.dtype)) for n, t in self._pool[0].items()] != layout:
            self._pool = []  # a new layout: new buffers
        pg = _gloo_group(store, g, rank, len(members) + 1, self.timeout_s)
        self.generations_joined += 1
        log.info("weight receiver %s joined generation %d as rank %d of %d", self.name, g, rank, len(members) + 1)
        seq = 0
        while not self._stop.is_set():
            key = f"gen/{g}/bcast/{seq}"
            try:  # blocks in the store (no polling traffic) until the learner announces the next one
                store.wait([key], timedelta(seconds=self.wait_s))
            except Exception:  # noqa: BLE001 - torch raises a timeout error of its own kind: check stop, wait again
                if not store.check([key]):
                    continue
            if int(store.get(key)) == GENERATION_OVER:
                now = int(store.get("gen"))
                nxt = json.loads(store.get(f"gen/{now}/members"))
                return (now, nxt) if self.name in nxt else None
            version = int(store.get(key))
            state = self._free_buffers(layout)
            works = [pg.recv([t], 0, tag) for tag, t in enumerate(state.values())]
            for work in works:
                work.wait()
            with self._lock:
                self._latest = (version, state)
                self.received += 1
                self._lock.notify_all()
            seq += 1
        return None

    def _free_buffers(self, layout: list[tuple[str, list[int], str]]) -> dict[str, torch.Tensor]:
        """A buffer set that is neither the newest complete version nor the one handed out last."""
        with self._lock:
            busy = {id(self._in_use), id(self._latest[1]) if self._latest else None}
            for buffers in self._pool:
                if id(buffers) not in busy:
                    return buffers
            buffers = {name: torch.empty(shape, dtype=_DTYPES[dtype]) for name, shape, dtype in layout}
            self._pool.append(buffers)
            return buffers

    def _await_membership(self, store, asked_at: int) -> tuple[int, list[str]] | None:
        """Wait (polling) for the first generation newer than `asked_at`: this worker's rank in it,
        or None if it left this worker out (a failed formation, or it read the joins before ours)."""
        while not self._stop.is_set():
            g = int(store.get("gen"))
            if g > asked_at:
                members = json.loads(store.get(f"gen/{g}/members"))
                return (g, members) if self.name in members else None
            self._stop.wait(self.poll_s)
        return None
