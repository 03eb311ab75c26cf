"""STARE loss vs vanilla GRPO loss on the same realistic step, same run.

Times one optimizer step's loss work, forward + backward, over all micro-batches:
  * from-logits: token log-probs and entropy from [mb, L, V] logits (log_softmax), then the policy
    loss; this is what the learner runs per micro-batch, and where the <= 3% target applies;
  * loss-only: the policy loss from token log-probs (elementwise work only; STARE's extra
    comparisons are a visible share of that small cost; no target).
STARE's time includes `plan_step` (the once-per-step sort that fixes the selection thresholds).
Each repeat runs one step of each loss interleaved piece by piece (the plan, then micro-batch by
micro-batch, the losses taking turns and rotating who goes first), after one warm-up; each cell is
a median, the ratio the median of the per-repeat ratios. Timed with glibc's malloc keeping freed
memory (as a GPU's caching allocator does): both losses allocate the same [mb, L, V] tensors, and
their fresh-page faults were ~70% of a step's time and most of its run-to-run noise.

Usage: python stare/app/bench/bench_loss.py [--seqs 64] [--length 512] [--vocab 16384] [--micro-batch 8] [--repeats 41]
(or `stare bench loss`)
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from learner.algorithm.losses import LossInputs, policy_loss
from learner.algorithm.step_plan import StepTokens, plan_step
from stare.app.bench.common import allocator_keeps_memory, format_table, paired_row, rotated
from stare.config.algo import GrpoLossConfig, StareLossConfig

TARGET = 1.03  # STARE / GRPO time, from logits
QUICK = dict(seqs=32, length=256, vocab=16384, micro_batch=8, repeats=31)
FULL = dict(seqs=64, length=512, vocab=16384, micro_batch=8, repeats=41)


def make_step(seqs: int, length: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 4, length + 1, (seqs,), generator=g)
    mask = torch.arange(length)[None] < lengths[:, None]  # [S, L]
    rewards = (torch.rand(seqs, generator=g) > 0.5).float()
    adv = ((rewards - 0.5) * 2)[:, None] * mask  # [S, L]
    tokens = torch.randint(0, vocab, (seqs, length), generator=g)  # [S, L]
    uid = torch.arange(seqs)[:, None] * (1 << 20) + torch.arange(length)[None]
    return dict(mask=mask, adv=adv, tokens=tokens, uid=uid)


def token_logprobs_entropy(logits: torch.Tensor, tokens: torch.Tensor):
    logp_full = torch.log_softmax(logits, -1)  # [mb, L, V]
    logp = logp_full.gather(-1, tokens[..., None]).squeeze(-1)  # [mb, L]
    entropy = -(logp_full.exp() * logp_full).sum(-1)  # [mb, L]
    return logp, entropy


def micro_batch_call(
    cfg,
    ctx,
    step,
    logits_mb: list[torch.Tensor] | None,
    old_logp: torch.Tensor,
    entropy0: torch.Tensor,
    mb: int,
    i: int,
) -> None:
    """Forward and backward of micro-batch i: log-probs and entropy from its logits (or, with no
    logits, the log-probs as leaves), then the policy loss."""
    rows = slice(i * mb, (i + 1) * mb)
    if logits_mb is not None:
        leaf = logits_mb[i].requires_grad_(True)
        logp, entropy = token_logprobs_entropy(leaf, step["tokens"][rows])
    else:
        logp = old_logp[rows].clone().requires_grad_(True)
        entropy = entropy0[rows]
    x = LossInputs(logp, old_logp[rows], step["adv"][rows], step["mask"][rows], step["uid"][rows], entropy=entropy)
    policy_loss(x, ctx, cfg).loss.backward()
    if logits_mb is not None:
        logits_mb[i].grad = None


def paired_step(cfgs: dict[str, Any], step, logits_mb, old_logp, entropy0, mb: int, first: int) -> dict[str, float]:
    """One step of each loss, interleaved piece by piece (the plan, then each micro-batch, the
    two losses taking turns, rotating who goes first): {loss: seconds of its step}. Load that comes
    and goes within the step slows both losses' pieces alike."""
    seqs, names = step["mask"].shape[0], list(cfgs)
    spent = dict.fromkeys(names, 0.0)
    ctxs = {}
    tokens = StepTokens(old_logp, entropy0, step["adv"], step["uid"], step["mask"])
    for name in rotated(names, first):
        t0 = time.perf_counter()
        ctxs[name] = plan_step(tokens, cfgs[name], gate=1.0, w=1.1, m=0.9)
        spent[name] += time.perf_counter() - t0
    for i in range(-(-seqs // mb)):
        for name in rotated(names, first + i):
            t0 = time.perf_counter()
            micro_batch_call(cfgs[name], ctxs[name], step, logits_mb, old_logp, entropy0, mb, i)
            spent[name] += time.perf_counter() - t0
    return spent


def measure(*, seqs: int, length: int, vocab: int, micro_batch: int, repeats: int) -> list[dict[str, Any]]:
    """Rows `loss` (from logits, target <= 1.03) and `loss/elementwise` (no target): STARE's step
    time over GRPO's, the median of the ratios of `repeats` paired steps (after one warm-up),
    timed with the allocator keeping freed memory (`allocator_keeps_memory`: both losses allocate
    the same vocabulary-sized tensors, whose page faults would otherwise be most of the time)."""
    torch.manual_seed(0)
    step = make_step(seqs, length, vocab)
    logits = [torch.randn(min(micro_batch, seqs - a), length, vocab) for a in range(0, seqs, micro_batch)]
    with torch.no_grad():
        parts = [
            token_logprobs_entropy(lg, step["tokens"][a : a + micro_batch])
            for lg, a in zip(logits, range(0, seqs, micro_batch))
        ]
    old_logp = torch.cat([p[0] for p in parts])  # [S, L]
    entropy0 = torch.cat([p[1] for p in parts])  # [S, L]
    cfgs = {"grpo": GrpoLossConfig(), "stare": StareLossConfig(variant="C2")}
    size = f"{seqs} seqs x {length} tokens, vocab {vocab:,}, micro-batch {micro_batch}"
    rows = []
    with allocator_keeps_memory() as kept:
        for name, what, lg, target in (
            ("loss", f"STARE vs GRPO step from logits, fwd+bwd ({size})", logits, TARGET),
            ("loss/elementwise", f"STARE vs GRPO policy loss from log-probs only ({size})", None, None),
        ):
            paired_step(cfgs, step, lg, old_logp, entropy0, micro_batch, 0)  # warm-up
            t = [paired_step(cfgs, step, lg, old_logp, entropy0, micro_batch, r) for r in range(repeats)]
            rows.append(
                paired_row(
                    name,
                    what,
                    [x["stare"] for x in t],
                    [x["grpo"] for x in t],
                    unit="s",
                    target=target,
                    higher_is_better=False,
                    threads=torch.get_num_threads(),
                    allocator_keeps_memory=kept,
                )
            )
    return rows


def run(quick: bool) -> list[dict[str, Any]]:
    return measure(**(QUICK if quick else FULL))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqs", type=int, default=64)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=FULL["repeats"])
    args = p.parse_args(argv)
    rows = measure(
        seqs=args.seqs, length=args.length, vocab=args.vocab, micro_batch=args.micro_batch, repeats=args.repeats
    )
    print(f"threads {torch.get_num_threads()}; ours = STARE, baseline = GRPO, median of {args.repeats} paired ratios")
    print(format_table(rows))


if __name__ == "__main__":
    main()
