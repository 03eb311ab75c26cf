"""The pre-pass ahead of a step (`Learner.prepare`): its values, kept on the host until the step.

While the session waits for data, the learner runs the step's no-grad pre-pass (`passes.prepass`,
the same function) over groups already scored, at the weights the next step trains with. Per
trajectory id the values, [k, response length] (old log-probs, entropy, the predicted dH when
diagnosed, the reference's log-probs with loss.ref_kl: `value_names`), are kept in host memory with that weight version (`PrepassStore`); the step
takes those of its rows prepared at its version (`prepared_rows`, moved to the device once) and runs
the pre-pass over its other rows only. Values of any other version are never used.

Covered: the same numbers as the step's own pre-pass, up to fp32 rounding (the micro-batch cut of
the rows differs). Not covered: which groups to prepare (the session's), the ranks (learner/process/ranks.py).
Memory: 4 x k bytes per response token kept, a step's worth of groups at most (the session's bound).
Host syncs: one per prepare call (`to_host`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from stare.transport.records import Trajectory


class PrepassStore:
    """Pre-pass values (trajectory id -> [k, response length], host) of one weight version."""

    def __init__(self) -> None:
        self.values: dict[str, Tensor] = {}
        self.version: int | None = None

    def keep(self, values: Mapping[str, Tensor], version: int) -> None:
        """Keep values computed at weight `version`; whatever was kept at another version is dropped."""
        if version != self.version:
            self.values, self.version = {}, version
        self.values.update(values)

    def get(self, trajectories: Sequence[Trajectory], version: int) -> dict[str, Tensor]:
        """The kept values of these trajectories computed at `version` (a trajectory prepared at
        another version, or not at all, or whose response length differs, is not there)."""
        if version != self.version:
            return {}
        return {
            t.trajectory_id: v
            for t in trajectories
            if (v := self.values.get(t.trajectory_id)) is not None and v.shape[1] == len(t.response_token_ids)
        }

    def clear(self) -> None:
        self.values, self.version = {}, None


def to_host(buffers: Sequence[Tensor], trajectories: Sequence[Trajectory]) -> dict[str, Tensor]:
    """The pre-pass's [S, L] buffers (row i: trajectory i) -> per trajectory id its [k, length] on the host."""
    host = torch.stack(list(buffers)).cpu()  # [k, S, L]  host sync: once per prepare call
    return {
        t.trajectory_id: host[:, i, : len(t.response_token_ids)].clone()  # own storage: pickled alone
        for i, t in enumerate(trajectories)
    }


def value_names(cfg: Any) -> tuple[str, ...]:
    """What the k rows of the kept values are, in order: the old log-probs and the entropy; the predicted dH
    with `diagnostics.predicted_entropy_change`; the reference's log-probs with `loss.ref_kl`."""
    return (
        ("old", "ent")
        + (("dh",) if cfg.diagnostics.predicted_entropy_change else ())
        + (("ref",) if cfg.loss.ref_kl is not None else ())
    )


def prepared_rows(
    trajectories: Sequence[Trajectory], kept: Mapping[str, Tensor], mask: Tensor, names: Sequence[str]
) -> tuple[Tensor, Tensor] | None:  # rows [K] long, values [k, K, L]; None: no row
    """The step's rows whose values are kept and those values (`names`: `value_names`), padded to the step's
    width ([S, L] `mask`, the loss mask). dH is 0 where the advantage is (off the loss mask), as the step's
    pre-pass gives it: a token may have left the loss since it was prepared (too stale at this version)."""
    rows = [i for i, t in enumerate(trajectories) if t.trajectory_id in kept]
    if not rows:
        return None
    first = kept[trajectories[rows[0]].trajectory_id]
    values = first.new_zeros(first.shape[0], len(rows), mask.shape[1])  # [k, K, L]
    for j, i in enumerate(rows):
        v = kept[trajectories[i].trajectory_id]  # [k, length]
        values[:, j, : v.shape[1]] = v
    if "dh" in names:
        values[list(names).index("dh")] *= mask[rows]
    return torch.tensor(rows, dtype=torch.long), values


def head_calls(plan: Sequence[Sequence[int]], trajectories: Sequence[Trajectory], chunk_tokens: int) -> list[int]:
    """The output-head calls of each micro-batch (rows of `trajectories`) of a pre-pass: one per
    `chunk_tokens` response tokens, at least one (as `ChunkedHead` calls it)."""
    return [max(-(-sum(len(trajectories[i].response_token_ids) for i in g) // chunk_tokens), 1) for g in plan]


def to_device(t: Tensor, device: torch.device) -> Tensor:
    """A host tensor on `device`: from pinned memory without blocking on CUDA (as `TrainBatch.to`)."""
    cuda = device.type == "cuda"
    return (t.pin_memory() if cuda else t).to(device, non_blocking=cuda)
