"""Weight broadcast over a point-to-point group formed at run time (gloo on CPU, NCCL on GPU).

The learner hosts a `TCPStore`; rollout workers dial it and ask to join (naming their GPU if they
can use NCCL). Membership changes only between steps: at each `publish` (and each `serve_joiners`,
called while the learner waits for data) the learner admits the workers that asked, picks the
generation's communicator (`communicator.py`: auto = NCCL when the learner and every member have
GPUs of their own, else gloo), forms a fresh group for the new membership (generation g: a group over
`PrefixStore("pg/g", store)`; `dist.new_group` cannot add processes) and sends the weights to it.
This file, `broadcast_recv.py` (the workers' end) and `buckets.py` are the same for both
communicators; only the group differs.

Sending: the version's layout is planned from the state's names, shapes and dtypes and stored
(when it changed); then the state is iterated once (`buckets.py`): small tensors packed into two
alternating fixed-size buckets, larger ones sent from their own memory in bucket-sized chunks, with
no header: receivers derive every message from the layout, so a version costs them no host sync
for headers. Each message goes to each member on its own (all members' sends issued, then awaited),
so a dead worker fails only its own sends (within `timeout_s` for a stalled one): the others get
the whole version, the learner carries on, and the lost member is skipped until the next generation
(it rejoins when it comes back). A joiner that dies before the group forms makes the formation fail
within `timeout_s`; that generation is dissolved and every member asks again.

Store keys: `joins` (counter), `join/<n>` (worker name), `join/<n>/gpu` (its GPU's id, "" without NCCL),
`gen` (current generation), `gen/<g>/members` (JSON list, rank = index + 1), `gen/<g>/comm` (gloo or
nccl), `gen/<g>/layout/<seq>` (the layout, JSON; written when it changes), `gen/<g>/bcast/<seq>`
("<version> <layout seq>" of the seq-th broadcast, or GENERATION_OVER), `version` (newest published),
`run` and `epoch` (whose store this is). With a `RedisRendezvous` the store binds any free port when given
port 0 and is announced in the run's Redis with its epoch (rendezvous.py), where workers find it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from stare.config import ConfigError
from stare.runtime.net import port_taken_message
from stare.weight_sync.broadcast_recv import GENERATION_OVER, BroadcastSubscriber
from stare.weight_sync.buckets import BucketPacker, Layout
from stare.weight_sync.communicator import (
    BuildCommunicator,
    Communicator,
    PointToPointGroup,
    Setting,
    Work,
    build_communicator,
    check_setting,
    choose_communicator,
    device_scope,
    nccl_gpu,
)
from stare.weight_sync.rendezvous import EPOCH_KEY, RUN_KEY, RedisRendezvous, Rendezvous
from stare.weight_sync.streams import Streams, streams_for

log = logging.getLogger(__name__)

_Sends = tuple[str, list[Work], torch.Tensor]  # a member, its sends of one message, the payload (kept alive)

DEFAULT_BUCKET_BYTES = 256 * 2**20


class BroadcastPublisher:
    """Learner side: hosts the rendezvous and sends each new version to the current members."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout_s: float = 30.0,
        communicator: Setting = "auto",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        communicators: BuildCommunicator = build_communicator,
        streams: Streams | None = None,
        rendezvous: RedisRendezvous | None = None,
        announce_host: str | None = None,
    ) -> None:
        """`communicators` builds a generation's group (stare.weight_sync.loopback's for an in-process check);
        `streams`: how the learner's device work is ordered (default: CUDA streams on the learner's GPU when
        it may use NCCL, else none); `rendezvous`: where this store announces itself to the run's workers
        (stare.weight_sync.rendezvous; `announce_host`: the address they dial)."""
        check_setting(communicator)
        self.timeout_s, self.setting, self.bucket_bytes = timeout_s, communicator, bucket_bytes
        self._gpu = nccl_gpu(communicator)
        # the learner's GPU, fixed here: `publish` may run in a thread of its own (background.py)
        self._device = torch.device("cuda", torch.cuda.current_device()) if self._gpu else None
        self.streams: Streams = streams or streams_for(self._device)
        self._communicators = communicators
        self._publish_streams: dict[str, object] = {}  # per communicator: the stream its sends run on
        self.store = _bind_store(host, port, timeout_s)
        # who this store is (rendezvous.py): workers join only their run's announced epoch
        self.epoch = rendezvous.new_epoch() if rendezvous is not None else 0
        self.store.set(RUN_KEY, rendezvous.run if rendezvous is not None else "")
        self.store.set(EPOCH_KEY, str(self.epoch))
        self.store.set("gen", "0")
        self.store.set("version", "-1")
        self.generation = 0
        self.members: list[str] = []  # the current generation, rank = index + 1
        self._lost: set[str] = set()  # members whose sends failed: skipped until the next generation
        self._pg: PointToPointGroup | None = None
        self._comm: Communicator | None = None  # the current generation's communicator
        self._packers: dict[str, BucketPacker] = {}  # per communicator: its buckets, reused
        self._member_gpus: dict[str, str | None] = {}
        self._seq = 0
        self._joins_seen = 0
        self._layout: Layout | None = None  # the layout stored for the current generation, and its key
        self._layout_seq = -1
        self.version = -1
        self.failures = 0
        if rendezvous is not None:  # last: a worker that finds it finds a store ready to serve
            rendezvous.announce(Rendezvous(announce_host or host, self.store.port, self.epoch, rendezvous.run))

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

    def serve_joiners(self, version: int, state_fn: Callable[[], Mapping[str, torch.Tensor]]) -> bool:
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
        return None if self._pg is None or self._comm is None else self._comm.name

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
            log.warning(
                "weight sync is nccl; %s have no NCCL or share a GPU with another member and stay out of the "
                "group: give every role its own GPU, or set system.weight_sync_communicator: auto",
                left_out,
            )
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
            self._comm = self._communicators(name, self._device)
            self._pg = self._comm.group(self.store, g, 0, len(members) + 1, self.timeout_s)
        except Exception as err:  # a joiner died before connecting: drop the generation
            self.failures += 1
            log.warning(
                "weight group generation %d (%d workers) did not form: %s; members must rejoin", g, len(members), err
            )
            self._dissolve(f"formation failed: {err}")
            return
        self.members, self._lost = members, set()
        log.info(
            "weight group generation %d (%s) formed with %d workers in %.2fs: %s",
            g,
            name,
            len(members),
            time.perf_counter() - t0,
            members,
        )

    def _layout_key(self, layout: Layout) -> int:
        """Store the version's layout if it changed; the broadcast seq it is stored under."""
        if layout != self._layout:
            self.store.set(f"gen/{self.generation}/layout/{self._seq}", json.dumps(layout.to_json()))
            self._layout, self._layout_seq = layout, self._seq
        return self._layout_seq

    def _broadcast(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Send one version on the communicator's publish stream, after the state's hand-over point:
        `state_dict.ready` (a background publish: recorded in the learner's thread, background.py), else the
        caller's stream now (a synchronous publish, whose caller's stream then waits for the sends: they may
        read the parameters themselves)."""
        pg, comm = self._pg, self._comm
        assert comm is not None and pg is not None, "a broadcast without a group"
        streams = comm.streams
        packer = self._packers.get(comm.name)
        if packer is None:
            packer = self._packers[comm.name] = BucketPacker(self.bucket_bytes, comm.device, streams)
        stream = self._publish_streams.get(comm.name)
        if stream is None:
            stream = self._publish_streams[comm.name] = streams.new_stream()
        ready = getattr(state_dict, "ready", None)
        background = ready is not None
        if not background:
            ready = streams.record()  # after the caller's work so far (the step that wrote the weights)
        elif comm.device.type == "cpu":
            self.streams.synchronize(ready)  # host buffers (gloo): the hand-over point reached, on the host
        layout = packer.layout(state_dict)
        self.store.set(f"gen/{self.generation}/bcast/{self._seq}", f"{version} {self._layout_key(layout)}")
        ranks = {rank: name for rank, name in enumerate(self.members, start=1) if name not in self._lost}
        lost: dict[str, str] = {}
        with streams.use(stream), device_scope(comm.device):
            streams.wait(ready)  # the publish stream: after the hand-over, not after later training work
            _send_all(pg, packer.messages(state_dict, layout), ranks, lost)
            sent = streams.record()
        if not background:
            streams.wait(sent)  # a synchronous publish: the caller's later work (the next update) after the sends
        self._seq += 1
        if lost:
            self.failures += 1
            self._lost.update(lost)
            log.warning(
                "weight version %d did not reach %s: %s; the other %d members have it",
                version,
                sorted(lost),
                "; ".join(lost.values()),
                len(self.alive_members),
            )
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


def _bind_store(host: str, port: int, timeout_s: float) -> Any:  # a torch TCPStore
    """The learner's TCPStore on host:port (0: any free port, `store.port` says which); a taken port
    fails with one line naming its holder and the fix, not c10d's traceback."""
    try:
        return dist.TCPStore(
            host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s), use_libuv=True
        )
    except RuntimeError as err:  # torch's DistNetworkError
        if port and ("EADDRINUSE" in str(err) or "address already in use" in str(err)):
            raise PortInUse(
                port_taken_message(
                    "system.broadcast_port",
                    host,
                    port,
                    "set system.broadcast_port=0 (any free port: workers find it in Redis), or stop that process",
                )
            ) from None
        raise


class PortInUse(ConfigError):
    """A configured port is taken (the message names the field, the holder and the fix)."""


def _send_all(pg: PointToPointGroup, messages: Any, ranks: dict[int, str], lost: dict[str, str]) -> None:
    """Each message (tag k: its index in the version) to each member on its own, every member's sends
    issued before any is awaited; message k-1 is awaited after message k is issued (its bucket is
    then refilled). A member that died or stalls past the timeout fails only its own sends (it goes
    into `lost`)."""
    previous: list[_Sends] = []
    for k, msg in enumerate(messages):
        current: list[_Sends] = []
        for rank, name in ranks.items():
            if name in lost:
                continue
            try:
                current.append((name, [pg.send([msg.payload], rank, k)], msg.payload))  # alive until awaited
            except Exception as err:
                lost[name] = str(err).splitlines()[0]
        _await(previous, lost)
        previous = current
    _await(previous, lost)


def _await(sends: list[_Sends], lost: dict[str, str]) -> None:
    """Wait for each member's sends; a member whose wait fails goes into `lost`."""
    for name, works, *_keep_alive in sends:
        if name in lost:
            continue
        try:
            for work in works:
                work.wait()
        except Exception as err:
            lost[name] = str(err).splitlines()[0]


__all__ = ["GENERATION_OVER", "BroadcastPublisher", "BroadcastSubscriber"]  # the workers' end re-exported
