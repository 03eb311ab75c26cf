"""The learner's collectives: gather the step's tokens (once per step), sum the counters (once per update).

The only module of the algorithm that talks to torch.distributed. Every collective runs on a group
created with a timeout (`init_process_group(..., timeout=...)`), so a dead rank raises instead of
hanging. With no initialised process group these are identities.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from learner.algorithm.step_plan import StepTokens


def _world(group) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def gather_step_tokens(local: StepTokens, group=None) -> StepTokens:
    """Every rank's StepTokens, concatenated in rank order (all ranks must pass the same [S, L])."""
    world = _world(group)
    if world == 1:
        return local
    parts: list[list[Tensor]] = []
    for name in StepTokens.__dataclass_fields__:
        t = getattr(local, name)
        send = t.to(torch.uint8) if t.dtype == torch.bool else t
        out = [torch.empty_like(send) for _ in range(world)]
        dist.all_gather(out, send.contiguous(), group=group)
        parts.append([o.to(torch.bool) if t.dtype == torch.bool else o for o in out])
    return StepTokens.cat([StepTokens(*(p[r] for p in parts)) for r in range(world)])


def all_gather_cat(t: Tensor, group=None) -> Tensor:
    """Every rank's `t` (the same shape on all), concatenated along dim 0 in rank order; identity on
    one process (each row's mini-batch index: [rows] -> [S])."""
    world = _world(group)
    if world == 1:
        return t
    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t.contiguous(), group=group)
    return torch.cat(out)


def all_reduce_sum(t: Tensor, group=None) -> Tensor:
    """Sum over ranks (in place on a copy); identity on one process."""
    if _world(group) == 1:
        return t
    out = t.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


def all_gather_ints(values: list[int], device: torch.device, group=None) -> list[list[int]]:
    """Every rank's few host ints (its rows, longest response, micro-batches), in rank order: one
    collective and one host read at step start; no collective on one process."""
    world = _world(group)
    if world == 1:
        return [list(values)]
    t = torch.tensor(values, dtype=torch.long, device=device)  # [k]
    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t, group=group)
    return torch.stack(out).tolist()  # host sync: step start (shapes must be known on the host)
