"""Which GPUs each role of `stare up` gets on one node (CUDA_VISIBLE_DEVICES per role process).

Defaults from the node's GPU count: the learner takes the first GPU (the first N with
`system.learner_ranks` N: one per rank), the rest go to rollout
workers, `rollout.engine.tensor_parallel_size` GPUs each (one vLLM worker per GPU with the
default 1); GPUs that do not fill a worker are left unused and listed. `--learner-gpus` and
`--rollout-gpus` ("0", "1,2", "1-7") choose the sets; they must be disjoint and exist. Reward
workers and the control plane see no GPU (CUDA_VISIBLE_DEVICES=""). With no GPU, every role
runs on CPU and nothing is set. A one-GPU node (no GPU left after the learner's, no
`--rollout-gpus`) gives the rollout worker the learner's GPU: set
`rollout.engine.gpu_memory_utilization` so that both fit. Node-colocated (`system.colocate: on`,
`colocated=True`): the learner's ranks take their GPUs (every GPU of the node unless fewer ranks are
asked for) and host the rollout engines; no rollout worker, no rollout GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from stare.config import ConfigError


def parse_gpus(text: str, flag: str) -> list[int]:
    """'0', '1,3', '1-7', '0,2-3' -> sorted distinct GPU indices; ConfigError naming `flag`."""
    out: set[int] = set()
    for part in str(text).split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise ConfigError(f"{flag} {text!r}: write GPU indices like 0 or 1,2 or 1-7")
        lo = int(m.group(1))
        out.update(range(lo, int(m.group(2) or lo) + 1))
    return sorted(out)


def node_gpu_count() -> int:
    """GPUs this process can see (CUDA_VISIBLE_DEVICES respected); 0 without CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@dataclass(frozen=True)
class GpuPlan:
    gpus: int  # GPUs on the node
    learner: list[int] = field(default_factory=list)
    rollout: list[list[int]] = field(default_factory=list)  # one list per rollout worker
    unused: list[int] = field(default_factory=list)
    shared: bool = False  # a one-GPU node: learner and rollout share it
    colocated: bool = False  # the learner ranks host the rollout engines (system.colocate: on)

    def devices(self, role: str) -> str:
        """CUDA_VISIBLE_DEVICES of role `role` (learner, rollout-3, reward-0, control)."""
        if role == "learner":
            ids = self.learner
        elif role.startswith("rollout-") and self.rollout:
            ids = self.rollout[int(role.removeprefix("rollout-"))]
        else:
            ids = []
        return ",".join(map(str, ids))


def plan_gpus(
    gpus: int,
    *,
    tensor_parallel_size: int = 1,
    rollout: int | None = None,
    learner_gpus: str | None = None,
    rollout_gpus: str | None = None,
    learner_ranks: int = 1,
    colocated: bool = False,
) -> GpuPlan:
    """The GPU map of one node; see the module docstring. `rollout`: the worker count asked for
    (None: as many as the rollout GPUs fill); `learner_ranks`: learner processes, one GPU each (the
    first ones unless `learner_gpus` names them); `colocated`: they host the rollout engines."""
    if colocated and (rollout_gpus is not None or rollout):
        raise ConfigError(
            "--rollout/--rollout-gpus given, but system.colocate is on: the learner ranks sample on "
            "their own GPUs and no rollout worker runs; drop them, or set system.colocate=off"
        )
    if gpus == 0:
        if learner_gpus or rollout_gpus:
            raise ConfigError(
                "--learner-gpus/--rollout-gpus given, but this node has no GPU (--gpus N to plan for one)"
            )
        return GpuPlan(0, colocated=colocated)
    learner = parse_gpus(learner_gpus, "--learner-gpus") if learner_gpus is not None else list(range(learner_ranks))
    if len(learner) != learner_ranks:
        raise ConfigError(
            f"--learner-gpus {learner_gpus} names {len(learner)} GPUs for {learner_ranks} learner ranks "
            "(system.learner_ranks, --learner-ranks): give one GPU per rank"
        )
    if colocated:
        if bad := [g for g in learner if g >= gpus]:
            raise ConfigError(f"--learner-gpus: GPU {bad[0]} does not exist; this node has {gpus} (0-{gpus - 1})")
        return GpuPlan(gpus, learner, [], [g for g in range(gpus) if g not in learner], colocated=True)
    free = [g for g in range(gpus) if g not in learner]
    pool = parse_gpus(rollout_gpus, "--rollout-gpus") if rollout_gpus is not None else free
    sharing = rollout_gpus is None and not free  # one GPU: rollout shares the learner's (split its memory)
    if sharing:
        pool = list(learner)
    for flag, ids in (("--learner-gpus", learner), ("--rollout-gpus", pool)):
        if bad := [g for g in ids if g >= gpus]:
            raise ConfigError(f"{flag}: GPU {bad[0]} does not exist; this node has {gpus} (0-{gpus - 1})")
    if not sharing and (shared := sorted(set(learner) & set(pool))):
        raise ConfigError(f"--learner-gpus and --rollout-gpus share GPU {shared}; give each role its own GPUs")
    tp = tensor_parallel_size
    fits = len(pool) // tp
    if fits == 0:
        raise ConfigError(
            f"no rollout worker fits: {len(pool)} rollout GPUs {pool}, and each worker needs "
            f"rollout.engine.tensor_parallel_size={tp}; free GPUs with --learner-gpus/--rollout-gpus"
        )
    if rollout is not None and rollout > fits:
        raise ConfigError(
            f"--rollout {rollout}: the rollout GPUs {pool} fit {fits} workers of "
            f"tensor_parallel_size={tp}; lower --rollout or give more GPUs with --rollout-gpus"
        )
    workers = fits if rollout is None else rollout
    groups = [pool[i * tp : (i + 1) * tp] for i in range(workers)]
    used = set(learner) | {g for grp in groups for g in grp}
    return GpuPlan(gpus, learner, groups, [g for g in range(gpus) if g not in used], sharing)
