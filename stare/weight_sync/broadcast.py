"""Weight broadcast over a point-to-point group formed at run time (gloo on CPU, NCCL on GPU).

The learner hosts a `TCPStore`; rollout workers dial it and ask to join (naming their GPU if they
can use NCCL). Membership changes only between steps: at each `publish` (and each `serve_joiners`,
called while the learner waits for data) the learner admits the workers that asked, picks the
generation's communicator (`communicator.py`: auto = NCCL when the learner and every member have
GPUs of their own, else gloo), forms a fresh group for the new membership (generation g: a group over
`PrefixStore("pg/g", store)`; `dist.new_group` cannot add processes) and sends the weights to it.
This file and `buckets.py` are the same for both communicators; only the group differs.

Sending: the state dict is iterated once (`buckets.py`): small tensors packed into two alternating
fixed-size buckets, larger ones sent from their own memory in bucket-sized chunks. Each message
goes to each member on its own (all members' sends issued, then awaited), so a dead worker fails
only its own sends (within `timeout_s` for a stalled one): the others get the whole version, the
learner carries on, and the lost member is skipped until the next generation (it rejoins when it
comes back). A joiner that dies before the group forms makes the formation fail within
`timeout_s`; that generation is dissolved and every member asks again. Workers that see their
generation dissolved, or lose the store (learner restart), or whose receive fails, rejoin from
scratch.

Receiving: a background thread per worker receives into a buffer set on the communicator's device
(CPU for gloo, the worker's GPU for NCCL): one contiguous buffer per segment, every tensor a view.
At most two sets exist: the one the rollout loop took last (`fetch`) and one being received; a
version that arrives before the previous one was taken overwrites it (the worker jumps to the
newest anyway). The rollout loop takes the newest between batches, so a learner broadcast never
waits for a generation to finish.

Store keys: `joins` (counter), `join/<n>` (worker name), `join/<n>/gpu` (its GPU's id, "" without NCCL),
`gen` (current generation), `gen/<g>/members` (JSON list, rank = index + 1), `gen/<g>/comm` (gloo or
nccl), `gen/<g>/bcast/<seq>` (the version the seq-th broadcast carries), `gen/<g>/layout/<seq>`
(names, shapes, dtypes, positions; written when it changes), `version` (newest published).
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

from stare.weight_sync.buckets import TERMINATOR, BucketPacker, Segments
from stare.weight_sync.communicator import (Setting, build_communicator, check_setting, choose_communicator,
                                            device_scope, nccl_device_id)

log = logging.getLogger(__name__)

GENERATION_OVER = -1  # announced instead of a version: the generation ended, read `gen`
DEFAULT_BUCKET_BYTES = 256 * 2**20


def _nccl_gpu(setting: Setting) -> str | None:
    """This end's GPU id for NCCL (None: gloo only)."""
    return nccl_device_id() if setting != "gloo" else None


class BroadcastPublisher:
    """Learner side: hosts the rendezvous and sends each new version to the current members."""

    def __init__(self, host: str, port: int, *, timeout_s: float = 30.0, communicator: Setting = "auto",
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        check_setting(communicator)
        self.timeout_s, self.setting, self.bucket_bytes = timeout_s, communicator, bucket_bytes
        self._gpu = _nccl_gpu(communicator)
        # the learner's GPU, fixed here: `publish` may run in a thread of its own (background.py)
        self._device = torch.device("cuda", torch.cuda.current_device()) if self._gpu else None
        self.store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=timeout_s), use_libuv=True)
        self.store.set("gen", "0")
        self.store.set("version", "-1")
        self.generation = 0
        self.members: list[str] = []  # the current generation, rank = index + 1
        self._lost: set[str] = set()  # members whose sends failed: skipped until the next generation
        self._pg = None
        self._comm = None  # the current generation's communicator
        self._packers: dict[str, BucketPacker] = {}  # per communicator: its buckets, reused
        self._member_gpus: dict[str, str | None] = {}
        self._seq = 0
        self._joins_seen = 0
        self._layout: list | None = None  # the layout stored for the current generation, and its key
        self._layout_seq = -1
        self.version = -1
        self.failures = 0

    # ---------------------------------------------------------------- API
    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Send `version` to every member, admitting new joiners first. Never raises for a
        worker's failure: a lost member is skipped, a failed formation dissolves the generation."""
        if version <= self.version:
            raise ValueError(f"weight version must increase: got {version} after {self.version}")
        joiners = self._new_joiners()
        if joiners or (self._pg is None and self.members):
            self._form(self.alive_members + [j for j in joiners if j not in self.alive_members])
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
        self._form(self.alive_members + joiners)
        if self._pg is not None:
            self._broadcast(version, state_fn())
        return True

    def close(self) -> None:
        self._dissolve("learner closing")
        self._pg = None

    @property
    def alive_members(self) -> list[str]:
        return [m for m in self.members if m not in self._lost]

    @property
    def communicator(self) -> str | None:
        """The current generation's communicator (None: no group)."""
        return None if self._pg is None else self._comm.name

    # ---------------------------------------------------------------- internals
    def _new_joiners(self) -> list[str]:
        """Names that asked to join since the last look. A ticket from a member of the current
        generation means that process is gone (a receiver asks again only after leaving its group:
        a restart, a failed receive): its old rank is lost and the name joins afresh, so the group
        re-forms now rather than after a send to the dead process failed."""
        count = self.store.add("joins", 0)
        names = []
        for n in range(self._joins_seen + 1, count + 1):
            name = self.store.get(f"join/{n}").decode()
            gpu = self.store.get(f"join/{n}/gpu").decode()  # set before the name
            self._member_gpus[name] = gpu or None
            if name in self.alive_members:
                self._lost.add(name)
                log.info("weight receiver %s asked to join again: its previous process left the group", name)
            if name not in names:  # a lost member may come back
                names.append(name)
        self._joins_seen = count
        return names

    def _end_generation(self, generation: int, seq: int) -> None:
        """Wake generation's members (blocked waiting for broadcast seq) to read the new `gen`;
        called after `gen` moved on."""
        self.store.set(f"gen/{generation}/bcast/{seq}", str(GENERATION_OVER))

    def _form(self, members: list[str]) -> None:
        name, left_out = choose_communicator(self.setting, self._gpu, {m: self._member_gpus.get(m) for m in members})
        if left_out:
            log.warning("weight sync is nccl; %s have no NCCL or share a GPU with another member and stay out of the "
                        "group: give every role its own GPU, or set system.weight_sync_communicator: auto", left_out)
            members = [m for m in members if m not in left_out]
        old = (self.generation, self._seq)
        self.generation += 1
        g = self.generation
        self.store.set(f"gen/{g}/comm", name)
        self.store.set(f"gen/{g}/members", json.dumps(members))
        self.store.set("gen", str(g))
        self._end_generation(*old)
        self._seq, self._layout = 0, None
        t0 = time.perf_counter()
        try:
            self._comm = build_communicator(name, self._device)
            self._pg = self._comm.group(self.store, g, 0, len(members) + 1, self.timeout_s)
        except Exception as err:  # a joiner died before connecting: drop the generation
            self.failures += 1
            log.warning("weight group generation %d (%d workers) did not form: %s; members must rejoin", g,
                        len(members), err)
            self._dissolve(f"formation failed: {err}")
            return
        self.members, self._lost = members, set()
        log.info("weight group generation %d (%s) formed with %d workers in %.2fs: %s", g, name, len(members),
                 time.perf_counter() - t0, members)

    def _layout_key(self, layout: list) -> int:
        """Store the layout of the version just packed if it changed; the broadcast seq it is under."""
        if layout != self._layout:
            self.store.set(f"gen/{self.generation}/layout/{self._seq}", json.dumps(layout))
            self._layout, self._layout_seq = layout, self._seq
        return self._layout_seq

    def _broadcast(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        pg, comm = self._pg, self._comm
        packer = self._packers.get(comm.name)
        if packer is None:
            packer = self._packers[comm.name] = BucketPacker(self.bucket_bytes, comm.device)
        self.store.set(f"gen/{self.generation}/bcast/{self._seq}", str(version))
        ranks = {rank: name for rank, name in enumerate(self.members, start=1) if name not in self._lost}
        lost: dict[str, str] = {}
        with device_scope(comm.device):
            _send_all(pg, comm.device, packer.messages(state_dict, self._layout_key), ranks, lost)
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


def _send_all(pg, device: torch.device, messages, ranks: dict[int, str], lost: dict[str, str]) -> None:
    """Each message to each member on its own, every member's sends issued before any is awaited;
    message k-1 is awaited after message k is issued (its bucket is then refilled). A member that
    died or stalls past the timeout fails only its own sends (it goes into `lost`)."""
    previous: list = []
    for k, msg in enumerate(messages):
        header = torch.tensor(msg.header, dtype=torch.int64, device=device)
        current = []
        for rank, name in ranks.items():
            if name in lost:
                continue
            try:
                works = [pg.send([header], rank, 2 * k)]
                if msg.payload is not None:
                    works.append(pg.send([msg.payload], rank, 2 * k + 1))
                current.append((name, works, header, msg.payload))  # the tensors stay alive until awaited
            except Exception as err:  # noqa: BLE001 - the backends raise RuntimeError subclasses
                lost[name] = str(err).splitlines()[0]
        _await(previous, lost)
        previous = current
    _await(previous, lost)


def _await(sends: list, lost: dict[str, str]) -> None:
    """Wait for each member's sends; a member whose wait fails goes into `lost`."""
    for name, works, *_keep_alive in sends:
        if name in lost:
            continue
        try:
            for work in works:
                work.wait()
        except Exception as err:  # noqa: BLE001
            lost[name] = str(err).splitlines()[0]


class BroadcastSubscriber:
    """Rollout side: joins the learner's group and receives every broadcast in a background thread;
    `fetch` hands the newest received version to the rollout loop."""

    def __init__(self, host: str, port: int, name: str, *, timeout_s: float = 30.0, poll_s: float = 0.05,
                 wait_s: float = 1.0, communicator: Setting = "auto"):
        check_setting(communicator)
        self.host, self.port, self.name = host, port, name
        self.timeout_s, self.poll_s, self.wait_s = timeout_s, poll_s, wait_s
        self._gpu = _nccl_gpu(communicator)
        self._device = torch.device("cuda", torch.cuda.current_device()) if self._gpu else None  # the engine's
        self._lock = threading.Condition()
        self._latest: tuple[int, dict[str, torch.Tensor], Segments] | None = None
        self._in_use: Segments | None = None  # the buffer set the last fetch handed out
        self._pool: list[Segments] = []  # at most two buffer sets, on the current communicator's device
        self._layouts: dict[tuple[int, int], list] = {}
        self._stop = threading.Event()
        self.generations_joined = 0
        self.received = 0
        self.communicator: str | None = None  # of the generation joined last
        self._thread = threading.Thread(target=self._run, name=f"weights-{name}", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- WeightSubscriber
    def fetch(self, have_version: int) -> tuple[int, Mapping[str, torch.Tensor]] | None:
        """The newest version if newer than have_version. Its tensors stay valid (not overwritten by
        later broadcasts) until the next `fetch`."""
        with self._lock:
            if self._latest is None or self._latest[0] <= have_version:
                self._in_use = None  # the caller is done with what it took before
                return None
            version, state, buffers = self._latest
            self._in_use = buffers
            return version, state

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
            except Exception as err:  # learner gone or restarting, or a receive failed: dial again
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
        store.set(f"join/{ticket}/gpu", self._gpu or "")
        store.set(f"join/{ticket}", self.name)
        joined = self._await_membership(store, asked_at)
        while joined is not None and not self._stop.is_set():
            joined = self._receive(store, *joined)

    def _receive(self, store, g: int, members: list[str]) -> tuple[int, list[str]] | None:
        """Receive generation g's broadcasts until the generation changes; the next generation if it
        lists this worker too (a member stays a member when others join), else None."""
        rank = members.index(self.name) + 1
        comm = build_communicator(store.get(f"gen/{g}/comm").decode(), self._device)
        pg = comm.group(store, g, rank, len(members) + 1, self.timeout_s)
        self.generations_joined += 1
        self.communicator = comm.name
        log.info("weight receiver %s joined generation %d (%s) as rank %d of %d", self.name, g, comm.name, rank,
                 len(members) + 1)
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
            buffers = self._free_buffers(comm.device)
            with device_scope(comm.device):
                layout_seq = self._receive_segments(pg, comm.device, buffers, comm.matched_by_tag)
            state = buffers.tensors(self._layout(store, g, layout_seq))
            with self._lock:
                self._latest = (version, state, buffers)
                self.received += 1
                self._lock.notify_all()
            seq += 1
        return None

    @staticmethod
    def _receive_segments(pg, device: torch.device, buffers: Segments, matched_by_tag: bool) -> int:
        """Receive one version's messages into `buffers`; the layout's seq from the terminator."""
        headers = [torch.empty(4, dtype=torch.int64, device=device) for _ in range(2)]
        buffers.start()
        pending = pg.recv([headers[0]], 0, 0)
        payloads = []  # distinct regions: awaited at the end (the next header arrives after them)
        k = 0
        while True:
            pending.wait()
            h = headers[k % 2].tolist()
            if h[2] == TERMINATOR:
                for work in payloads:
                    work.wait()
                buffers.finish()
                return h[3]
            target = buffers.target(h)
            if matched_by_tag:  # ask for the next header first: it overtakes this payload, so the next
                pending = pg.recv([headers[(k + 1) % 2]], 0, 2 * k + 2)  # payload is asked for while this one streams
                payloads.append(pg.recv([target], 0, 2 * k + 1))
            else:  # in the sender's order
                payloads.append(pg.recv([target], 0, 2 * k + 1))
                pending = pg.recv([headers[(k + 1) % 2]], 0, 2 * k + 2)
            k += 1

    def _layout(self, store, g: int, layout_seq: int) -> list:
        key = (g, layout_seq)
        if key not in self._layouts:
            self._layouts = {key: json.loads(store.get(f"gen/{g}/layout/{layout_seq}"))}  # keep only the newest
        return self._layouts[key]

    def _free_buffers(self, device: torch.device) -> Segments:
        """A buffer set to receive into: not the one handed out last; a third set is never made:
        the newest complete version is overwritten instead (it is withdrawn first)."""
        with self._lock:
            self._pool = [b for b in self._pool if b.device == device]
            latest = self._latest[2] if self._latest else None
            for buffers in self._pool:
                if buffers is not self._in_use and buffers is not latest:
                    return buffers
            if len(self._pool) < 2:
                self._pool.append(Segments(device))
                return self._pool[-1]
            self._latest = None  # superseded before it was taken: its buffers take the newer version
            return latest

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
