"""STARE loss vs vanilla GRPO loss on the same realistic step, same run.

Times one optimizer step's loss work, forward + backward, over all micro-batches:
  * from-logits: token log-probs and entropy from [mb, L, V] logits (log_softmax), then the policy
    loss; this is what the learner runs per micro-batch, and where the <= 3% target applies;
  * loss-only: the policy loss from token log-probs (elementwise work only; STARE's extra
    comparisons are a visible share of that small cost).
STARE's time includes `plan_step` (the once-per-step sort that fixes the selection thresholds).

Usage: python bench/bench_loss.py [--seqs 64] [--length 512] [--vocab 16384] [--micro-batch 8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from stare.algo_config import GrpoLossConfig, StareLossConfig
from stare.learner.policy_loss import LossInputs, policy_loss
from stare.learner.step_plan import StepTokens, plan_step


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


def run_step(cfg, step, logits_mb: list[torch.Tensor] | None, old_logp: torch.Tensor, entropy0: torch.Tensor, mb: int):
    tokens = StepTokens(old_logp, entropy0, step["adv"], step["uid"], step["mask"])
    ctx = plan_step(tokens, cfg, gate=1.0, w=1.1, m=0.9)
    seqs = step["mask"].shape[0]
    for i, a in enumerate(range(0, seqs, mb)):
        rows = slice(a, a + mb)
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


def time_it(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqs", type=int, default=64)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    step = make_step(args.seqs, args.length, args.vocab)
    logits = [torch.randn(min(args.micro_batch, args.seqs - a), args.length, args.vocab)
              for a in range(0, args.seqs, args.micro_batch)]
    with torch.no_grad():
        parts = [token_logprobs_entropy(lg, step["tokens"][a : a + args.micro_batch])
                 for lg, a in zip(logits, range(0, args.seqs, args.micro_batch))]
    old_logp = torch.cat([p_[0] for p_ in parts])
    entropy0 = torch.cat([p_[1] for p_ in parts])
    grpo, stare = GrpoLossConfig(), StareLossConfig(variant="C2")

    rows = []
    for label, lg in (("from-logits", logits), ("loss-only", None)):
        times = {"grpo": [], "stare": []}
        run_step(grpo, step, lg, old_logp, entropy0, args.micro_batch)  # warm-up
        run_step(stare, step, lg, old_logp, entropy0, args.micro_batch)
        for _ in range(args.repeats):  # interleaved so drift hits both equally
            times["grpo"] += time_it(lambda: run_step(grpo, step, lg, old_logp, entropy0, args.micro_batch), 1)
            times["stare"] += time_it(lambda: run_step(stare, step, lg, old_logp, entropy0, args.micro_batch), 1)
        g, s = statistics.median(times["grpo"]), statistics.median(times["stare"])
        rows.append((label, g, s, s / g))

    tokens = int(step["mask"].sum())
    print(f"step: {args.seqs} seqs x {args.length} max tokens ({tokens} response tokens), vocab {args.vocab}, "
          f"micro-batch {args.micro_batch}, median of {args.repeats}, threads {torch.get_num_threads()}")
    print(f"{'work':<12} {'GRPO s':>10} {'STARE s':>10} {'STARE/GRPO':>11}")
    for label, g, s, r in rows:
        print(f"{label:<12} {g:>10.4f} {s:>10.4f} {r:>11.3f}")
    print(f"target: from-logits STARE/GRPO <= 1.030 -> {'met' if rows[0][3] <= 1.03 else 'NOT met'}")


if __name__ == "__main__":
    main()
