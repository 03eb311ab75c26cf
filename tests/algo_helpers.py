"""Builders shared by the algorithm tests (not a test module)."""

from __future__ import annotations

import torch

from learner.algorithm.losses import LossInputs, StepContext, policy_loss
from learner.algorithm.step_plan import StepTokens, plan_step

MAX_LEN_STRIDE = 1 << 20


def uids_for(rows: int, length: int, first_row: int = 0) -> torch.Tensor:  # [rows, length]
    r = torch.arange(first_row, first_row + rows)[:, None]
    return r * MAX_LEN_STRIDE + torch.arange(length)[None, :]


def random_step(seed: int, rows: int = 8, length: int = 12, dtype=torch.float64, tie_decimals: int | None = 1):
    """A step with ties in surprisal (rounded log-probs), mixed-sign advantages and ragged masks."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, length, generator=g, dtype=dtype) * 3
    if tie_decimals is not None:
        old = torch.round(old, decimals=tie_decimals)
    lengths = torch.randint(1, length + 1, (rows,), generator=g)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    mask[-1] = False  # one fully masked row
    seq_adv = torch.randn(rows, generator=g, dtype=dtype)
    seq_adv[1] = 0.0
    adv = seq_adv[:, None] * mask
    entropy = torch.rand(rows, length, generator=g, dtype=dtype)
    logp = old + 0.3 * torch.randn(rows, length, generator=g, dtype=dtype)
    return dict(old=old, logp=logp, adv=adv, mask=mask, entropy=entropy, uid=uids_for(rows, length))


def step_tokens(s: dict) -> StepTokens:
    return StepTokens(s["old"], s["entropy"], s["adv"], s["uid"], s["mask"])


def inputs(s: dict, rows=slice(None), logp=None, entropy=None) -> LossInputs:
    lp = s["logp"] if logp is None else logp
    return LossInputs(
        logprobs=lp[rows],
        old_logprobs=s["old"][rows],
        advantages=s["adv"][rows],
        mask=s["mask"][rows],
        token_uid=s["uid"][rows],
        entropy=(s["entropy"] if entropy is None else entropy)[rows],
        step_entropy=s["entropy"][rows],
        ref_logprobs=s["ref"][rows] if "ref" in s else None,  # the reference's log-probs (loss.ref_kl)
    )


def loss_and_grad(s: dict, cfg, *, splits: int = 1, gate=1.0, w=1.3, m=0.7, seed=0):
    """Total loss and d loss / d logp with the step split into `splits` micro-batches."""
    ctx = plan_step(step_tokens(s), cfg, gate=gate, w=w, m=m, seed=seed)
    logp = s["logp"].clone().requires_grad_(True)
    entropy = s["entropy"].clone().requires_grad_(True)
    rows = s["mask"].shape[0]
    bounds = torch.linspace(0, rows, splits + 1).round().long().tolist()
    total = torch.zeros((), dtype=logp.dtype)
    for a, b in zip(bounds[:-1], bounds[1:]):
        out = policy_loss(inputs(s, slice(a, b), logp=logp, entropy=entropy), ctx, cfg)
        out.loss.backward()
        total = total + out.loss.detach()
    return total, logp.grad, ctx


def context(ctx: StepContext, **changes) -> StepContext:
    from dataclasses import replace

    return replace(ctx, **changes)


def dp_worker(rank: int, world: int, port: int, cfg, step: dict, out_dir: str) -> None:
    """One data-parallel rank: its rows are rank::world; gathers the step, plans, backprops its share."""
    import datetime

    import torch.distributed as dist

    from learner.engine.collectives import all_reduce_sum, gather_step_tokens

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        rows = slice(rank, None, world)
        local = {k: v[rows] for k, v in step.items()}
        ctx = plan_step(gather_step_tokens(step_tokens(local)), cfg, gate=1.0, w=1.3, m=0.7, seed=2)
        logp = local["logp"].clone().requires_grad_(True)
        shift = torch.zeros((), dtype=logp.dtype, requires_grad=True)  # a parameter every rank shares
        out = policy_loss(inputs(local, logp=logp + shift), ctx, cfg)
        out.loss.backward()
        shared_grad = all_reduce_sum(shift.grad.detach())
        loss = all_reduce_sum(out.loss.detach())
        torch.save({"grad": logp.grad, "shared": shared_grad, "loss": loss}, f"{out_dir}/rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
