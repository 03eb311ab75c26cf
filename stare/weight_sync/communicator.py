"""The one part of the weight broadcast that differs between CPU and GPU: the point-to-point group.

`broadcast.py` (membership, generations, timeouts, skipping dead members) and `buckets.py` (the
wire format) are shared; a communicator only builds the group of one generation and says where
its buffers live and how work there is ordered (`streams`: stare.weight_sync.streams):

- `GlooCommunicator`: `ProcessGroupGloo` over the learner's store, CPU buffers (the tested path);
- `NcclCommunicator`: `ProcessGroupNCCL` over the same store, buffers on this process's GPU (what
  vLLM's `stateless_init_process_group` does with `StatelessProcessGroup` + `PyNcclCommunicator`,
  here with torch's own NCCL group so the learner needs no vLLM; cannot run on this CPU machine).

Both groups are built from a `PrefixStore("pg/<generation>", store)` with rank 0 the learner and
give `send(tensors, dst, tag)` / `recv(tensors, src, tag)` returning works whose `wait()` blocks
the host and raises within the timeout (NCCL: blocking wait, communicators aborted on error rather
than the process torn down). NCCL ignores tags and pairs in issue order, gloo matches by tag: a
receiver posts every receive of a version in the sender's order, which suits both.

`choose_communicator` picks one per generation from `system.weight_sync_communicator`: auto =
NCCL when the learner and every member have a GPU of their own (NCCL refuses two ranks on one
GPU), else gloo.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Literal, Protocol

import torch
import torch.distributed as dist

from stare.weight_sync.streams import CudaStreams, HostStreams, Streams

CommunicatorName = Literal["gloo", "nccl"]

# Read by ProcessGroupNCCL's constructor, set only around it (the learner's DeepSpeed groups and
# vLLM's keep theirs): a failed or timed-out send or receive raises in wait() on the host and
# aborts this group's communicators (ASYNC_ERROR_HANDLING 2, CleanUpOnly), instead of the watchdog
# tearing the process down (the default, 3); and it raises no flight-recorder dump signal
# (DUMP_ON_TIMEOUT 0), which would make the process's first NCCL group's heartbeat monitor, the
# learner's DeepSpeed group, dump and then abort the whole learner because one rollout worker died.
# ENABLE_MONITORING 0: where this group is a process's first NCCL group (a rollout worker), no
# heartbeat monitor of its own either. Checked from torch's ProcessGroupNCCL source, not on a GPU.
NCCL_GROUP_ENV = {
    "TORCH_NCCL_BLOCKING_WAIT": "1",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
    "TORCH_NCCL_ENABLE_MONITORING": "0",
}
Setting = Literal["auto", "gloo", "nccl"]


class Work(Protocol):
    """A posted send or receive (`dist.Work`, the loopback's `LoopbackWork`)."""

    def wait(self) -> bool: ...


class PointToPointGroup(Protocol):
    """What the broadcast uses of a process group (`ProcessGroupGloo`, `ProcessGroupNCCL`): tagged sends
    and receives, each a work to `wait()` on."""

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int, /) -> Work: ...

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int, /) -> Work: ...


class Communicator(Protocol):
    @property
    def name(self) -> str:
        """gloo, nccl (loopback: stare.weight_sync.loopback)."""
        ...

    @property
    def device(self) -> torch.device:
        """Where send and receive buffers live."""
        ...

    @property
    def streams(self) -> Streams:
        """How work on `device` is ordered (stare.weight_sync.streams)."""
        ...

    def group(self, store: dist.Store, generation: int, rank: int, size: int, timeout_s: float) -> PointToPointGroup:
        """The point-to-point group of one generation (rank 0: the learner)."""
        ...


class GlooCommunicator:
    name: CommunicatorName = "gloo"
    device = torch.device("cpu")
    streams: Streams = HostStreams()

    def group(self, store: dist.Store, generation: int, rank: int, size: int, timeout_s: float) -> PointToPointGroup:
        prefix = dist.PrefixStore(f"pg/{generation}", store)
        # torch's stub of Backend (ProcessGroupGloo's base) omits send/recv, which it has at runtime
        return dist.ProcessGroupGloo(prefix, rank, size, timedelta(seconds=timeout_s))  # type: ignore[return-value]


class NcclCommunicator:
    """NCCL on this process's current CUDA device (the vLLM worker's, the learner's local rank)."""

    name: CommunicatorName = "nccl"

    def __init__(self, device: torch.device | None = None) -> None:
        problem = nccl_problem()
        if problem:
            raise RuntimeError(
                f"NCCL weight sync is not possible here: {problem}; set "
                "system.weight_sync_communicator: gloo (or auto, which picks gloo without CUDA)"
            )
        self.device = device or torch.device("cuda", torch.cuda.current_device())
        self.streams: Streams = CudaStreams(self.device)

    def group(self, store: dist.Store, generation: int, rank: int, size: int, timeout_s: float) -> PointToPointGroup:
        prefix = dist.PrefixStore(f"pg/{generation}", store)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timedelta(seconds=timeout_s)
        saved = {k: os.environ.get(k) for k in NCCL_GROUP_ENV}
        os.environ.update(NCCL_GROUP_ENV)
        try:
            with torch.cuda.device(self.device):
                # torch's stub of Backend (ProcessGroupNCCL's base) omits send/recv, which it has at runtime
                return dist.ProcessGroupNCCL(prefix, rank, size, options)  # type: ignore[return-value]
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def device_scope(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """Make `device` current in this thread (a sender or receiver thread starts on GPU 0)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def nccl_problem() -> str | None:
    """Why this process cannot use NCCL (None: it can)."""
    if not torch.cuda.is_available():
        return "no CUDA device is visible to this process"
    if not (dist.is_nccl_available() and hasattr(dist, "ProcessGroupNCCL")):
        return f"this torch build ({torch.__version__}) has no NCCL"
    return None


def nccl_gpu(setting: Setting) -> str | None:
    """This end's GPU id for NCCL under `setting` (None: gloo only)."""
    return nccl_device_id() if setting != "gloo" else None


def has_nccl() -> bool:
    return nccl_problem() is None


def nccl_device_id() -> str | None:
    """This process's current GPU as NCCL sees it (its UUID), or None when it cannot use NCCL. NCCL
    refuses two ranks of one communicator on the same GPU, so ids must differ across a group."""
    if not has_nccl():
        return None
    return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)


def choose_communicator(
    setting: Setting, learner_gpu: str | None, member_gpus: dict[str, str | None]
) -> tuple[CommunicatorName, list[str]]:
    """The communicator of a generation and the members it leaves out (pure). `learner_gpu` and
    `member_gpus`: each end's `nccl_device_id()` (None: no NCCL).

    gloo: gloo for everyone. auto: NCCL when the learner and every member can use it on GPUs of their
    own (a single-GPU box runs learner and worker on one GPU: gloo), else gloo for everyone. nccl:
    NCCL; members without NCCL (they refuse to start anyway, see `check_setting`) or on a GPU
    already in the group are left out, and a learner without NCCL is a config error."""
    if setting == "gloo":
        return "gloo", []
    if setting not in ("auto", "nccl"):
        raise ValueError(f"system.weight_sync_communicator must be auto, gloo or nccl, got {setting!r}")
    if learner_gpu is None and setting == "nccl":
        raise ValueError(
            "system.weight_sync_communicator is nccl but the learner has no CUDA/NCCL: set it to auto or gloo"
        )
    taken, left_out = {learner_gpu}, []
    for name, gpu in member_gpus.items():
        if gpu is None or gpu in taken:
            left_out.append(name)
        taken.add(gpu)
    if setting == "auto":
        return ("nccl" if learner_gpu is not None and member_gpus and not left_out else "gloo"), []
    return "nccl", sorted(left_out)


def check_setting(setting: Setting) -> None:
    """At either end's start: a forced NCCL setting in a process that cannot use NCCL is an error."""
    if setting == "nccl" and (problem := nccl_problem()):
        raise RuntimeError(f"system.weight_sync_communicator is nccl but {problem}: set it to auto or gloo")
    if setting not in ("auto", "gloo", "nccl"):
        raise ValueError(f"system.weight_sync_communicator must be auto, gloo or nccl, got {setting!r}")


BuildCommunicator = Callable[[str, "torch.device | None"], Communicator]


def build_communicator(name: str, device: torch.device | None = None) -> Communicator:
    """`device`: the GPU for NCCL (None: the calling thread's current one). Both ends take it as a seam
    (`BuildCommunicator`): an in-process check passes stare.weight_sync.loopback's instead."""
    return NcclCommunicator(device) if name == "nccl" else GlooCommunicator()
