"""A step's trajectories -> its batch and micro-batches on the host (`cut_step`), for one rank of
several: the rows every rank agrees on (global token uids, a common response width), each update's
micro-batches and the pre-pass's, with as many micro-batches and output-head calls on every rank
as the ranks' collectives need (fillers make up the difference).

The pre-pass runs over the step's own micro-batches when no row of this rank was prepared ahead
(learner/step/prepass_store.py; the step without preparation, exactly), else over micro-batches of its
unprepared rows only. The host syncs: one gather of host ints at step start, and under ZeRO-3 over
several ranks a second one (each micro-batch's head calls).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch

from learner.engine.collectives import all_gather_ints
from learner.step.batch import TrainBatch, collate
from learner.step.micro_batches import MicroBatch, build_micro_batch, filler_micro_batch, plan_rows
from learner.step.ppo_updates import mini_batch_rows
from learner.step.prepass_store import prepared_rows, value_names
from stare.config import TrainConfig
from stare.transport.records import Trajectory


@dataclasses.dataclass(frozen=True)
class StepCut:
    """A step on the host, as `cut_step` cuts it."""

    batch: TrainBatch  # global token uids, the ranks' common width
    updates: list[list[MicroBatch]]  # each update's micro-batches
    prepass: list[MicroBatch]  # the pre-pass's micro-batches (the updates' when no row is prepared)
    prepared: tuple[torch.Tensor, torch.Tensor] | None  # prepared rows [K] long and their values [k, K, L]; None: none
    row_update: torch.Tensor  # [rows] long, each row's mini-batch, -1 for padding rows
    prepared_rows: int = 0  # prepared rows over every rank


@dataclasses.dataclass(frozen=True)
class RankRows:
    """What a rank's cut depends on besides its trajectories."""

    cfg: TrainConfig
    rank: int
    world: int
    rows: int  # this rank's rows (its share of the step's groups, padded)
    micro: int  # rows per micro-batch (no token budget)
    pad_id: int
    device: torch.device  # the collectives' (host ints gathered)

    @property
    def pack(self) -> bool:
        o = self.cfg.optim
        return o.max_tokens_per_micro_batch is not None and o.pack_sequences

    def plan(self, trajectories: Sequence[Trajectory], rows: Sequence[int]) -> list[list[int]]:
        """Micro-batches (indices into `trajectories`) over `rows`, as a step cuts its rows (host ints)."""
        prompts = [len(trajectories[i].prompt_token_ids) for i in rows]
        responses = [len(trajectories[i].response_token_ids) for i in rows]
        return [
            [rows[i] for i in g]
            for g in plan_rows(
                prompts,
                responses,
                micro_batch=self.micro,
                max_tokens=self.cfg.optim.max_tokens_per_micro_batch,
                pack=self.pack,
            )
        ]


def cut_step(trajectories: list[Trajectory], kept: Mapping[str, torch.Tensor], at: RankRows) -> StepCut:
    """This rank's part of the step; `kept`: pre-pass values of some of its trajectories. Per
    mini-batch the micro-batch count is the ranks' maximum, and so is the pre-pass's. Rank r's
    trajectories are the step's rows after those of ranks < r."""
    o, pack, pad = at.cfg.optim, at.pack, at.pad_id
    count = len(trajectories)
    r_lens = [len(t.response_token_ids) for t in trajectories]
    shares = mini_batch_rows(trajectories, o.mini_batches)  # one mini-batch: every row, in order
    plans = [at.plan(trajectories, rows) for rows in shares]
    fresh = [i for i, t in enumerate(trajectories) if t.trajectory_id not in kept]
    fresh_plan = None if len(fresh) == count else at.plan(trajectories, fresh)
    longest = max(r_lens, default=1)  # a rank may have no rows
    ranks = all_gather_ints(
        [count, longest, count - len(fresh), *(len(p) for p in plans), -1 if fresh_plan is None else len(fresh_plan)],
        at.device,
    )  # host sync: step start
    real = [r[0] for r in ranks]
    before = sum(real[: at.rank])
    pad_before = sum(real) + sum(at.rows - n for n in real[: at.rank])
    batch = collate(
        trajectories,
        pad_id=pad,
        rows=at.rows,
        scale_by_std=at.cfg.data.advantage_std,
        first_row=before,
        pad_first_row=pad_before,
        width=max(r[1] for r in ranks),
    )
    filler = filler_micro_batch(pad, pack=pack)
    updates = []
    for j, plan in enumerate(plans):
        mbs = [build_micro_batch(g, batch.prompts, batch.responses, pad_id=pad, pack=pack) for g in plan]
        updates.append(mbs + [filler] * (max(r[3 + j] for r in ranks) - len(mbs)))
    flat = [mb for mbs in updates for mb in mbs]  # as many on every rank
    separate = any(r[-1] >= 0 for r in ranks)  # some rank prepared rows: its pre-pass is cut apart
    pre = flat
    if separate:  # every rank as many pre-pass forwards (ZeRO-3 gathers are collective)
        if fresh_plan is not None:
            pre = [build_micro_batch(g, batch.prompts, batch.responses, pad_id=pad, pack=pack) for g in fresh_plan]
        pre = pre + [filler] * (max(len(flat) if r[-1] < 0 else r[-1] for r in ranks) - len(pre))
    if at.world > 1 and o.zero_stage == 3:  # as many output-head calls per micro-batch on every rank
        calls = flat + (pre if separate else [])
        chunks = [max(-(-mb.targets.shape[0] // o.logits_chunk_tokens), 1) for mb in calls]  # host ints
        most = iter([max(c) for c in zip(*all_gather_ints(chunks, at.device))])  # host sync: step start
        calls = [dataclasses.replace(mb, min_chunks=next(most)) for mb in calls]
        flat, pre = calls[: len(flat)], (calls[len(flat) :] if separate else calls[: len(flat)])
        regroup = iter(flat)
        updates = [[next(regroup) for _ in mbs] for mbs in updates]
    row_update = torch.full((at.rows,), -1, dtype=torch.long)  # [rows]
    for j, rows in enumerate(shares):
        row_update[rows] = j
    return StepCut(
        batch,
        updates,
        pre,
        prepared_rows(trajectories, kept, batch.mask, value_names(at.cfg)),
        row_update,
        prepared_rows=sum(r[2] for r in ranks),
    )
