"""Could STARE's selection take its surprisal keys from the rollout engine's log-probs instead of the learner's
pre-pass? A CPU measurement on one sampled step.

The learner's no-grad pre-pass (2N of the ~10N FLOPs a token) exists to give the step its old log-probs before
the first backward: STARE's top-P surprisal selection inside each advantage sign is planned over the whole step
from them. The rollout engine already returns each sampled token's log-prob. This script samples one step with
the config, then compares, for the learner's weights one update after sampling (the max_staleness 1 case) and
for the rollout log-probs computed in bf16 (the precision gap a GPU rollout engine adds):

* the selection: the share of the exact selection's tokens (keys: the learner's log-probs at its current
  weights) that the approximate one (keys: the rollout's) does not select, per advantage sign;
* the step: the relative L2 norm of the difference of the two policy-gradient directions (STARE's omega times
  the advantage times grad log pi, summed over the step's loss tokens: the first update of a step, where the
  PPO ratio is 1 and nothing is clipped), against the same norm for a mismatch the system already accepts:
  truncated importance sampling on versus off (loss.rollout_correction's token-level weights
  exp(old - rollout) capped at 2), which corrects exactly this staleness and precision gap.

    python scripts/prepass_from_rollout.py --seeds 0,1,2,3,4          # the tiny config, 5 seeds

Prints one line per seed and the means, and writes them as JSON with --json FILE. On the bundled tiny model
(2 layers, a small vocabulary) the surprisal distribution is not a 7B model's: the numbers say whether the
approximation is in the tolerated range here, not at 7B.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path


def token_logprobs(module, trajectories, dtype, pad: int):
    """Per trajectory its response tokens' log-probs under `module` cast to `dtype` (fp32 result)."""
    import torch

    out = []
    model = module.to(dtype)
    with torch.no_grad():
        for t in trajectories:
            ids = torch.tensor([list(t.prompt_token_ids) + list(t.response_token_ids)])
            logits = model(input_ids=ids).logits.float()[0]  # [T, V]
            p = len(t.prompt_token_ids)
            lp = torch.log_softmax(logits[p - 1 : -1], dim=-1)  # predicts tokens p..T-1
            out.append(lp.gather(1, torch.tensor(t.response_token_ids).unsqueeze(1)).squeeze(1))
    module.to(torch.float32)
    return out


def padded(rows, fill: float = 0.0):
    import torch

    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), fill)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=torch.float32)
    return out


def selection(keys, advantages, mask, uid, top_fraction: float):
    """STARE's L+ and L- masks with `keys` as the log-probs (the product's select_stare and in_topk)."""
    from types import SimpleNamespace

    from learner.algorithm.losses.base import StepTokens
    from learner.algorithm.losses.stare import select_stare
    from learner.algorithm.selection import in_topk

    tokens = StepTokens(keys, keys * 0, advantages, uid, mask)
    thresholds, _ = select_stare(tokens, SimpleNamespace(top_fraction=top_fraction), 0)
    pos = in_topk(-keys, uid, mask & (advantages > 0), thresholds["pos_threshold"])
    neg = in_topk(-keys, uid, mask & (advantages < 0), thresholds["neg_threshold"])
    return pos, neg


def missed(exact, approx) -> float:
    n = int(exact.sum())
    return float((exact & ~approx).sum()) / n if n else 0.0


def gradient(module, trajectories, weights, advantages, mask, pad: int):
    """grad of sum(weights x advantages x log pi) / tokens over the step's loss tokens (fp32)."""
    import torch

    module.zero_grad()
    total = mask.sum()
    for i, t in enumerate(trajectories):
        ids = torch.tensor([list(t.prompt_token_ids) + list(t.response_token_ids)])
        logits = module(input_ids=ids).logits.float()[0]
        p, n = len(t.prompt_token_ids), len(t.response_token_ids)
        lp = torch.log_softmax(logits[p - 1 : -1], dim=-1).gather(1, torch.tensor(t.response_token_ids).unsqueeze(1))
        w = (weights[i, :n] * advantages[i, :n] * mask[i, :n]).detach()
        (-(w * lp.squeeze(1)).sum() / total).backward()
    return torch.cat([p.grad.reshape(-1).clone() for p in module.parameters() if p.grad is not None])


def one_seed(config: Path, overrides: list[str], seed: int, out: Path) -> dict:
    import torch

    from learner.step.trainer import Learner
    from stare.app.launch.embedded import EmbeddedRun
    from stare.config import load_config
    from stare.models.resolve import resolve_model

    base = [*overrides, f"run.output_dir={out}", f"run.name=probe-{seed}", f"run.seed={seed}", "task.eval_problems=4"]
    cfg = load_config(config, overrides=base)
    if cfg.run.threads is not None:
        torch.set_num_threads(cfg.run.threads)
    run = EmbeddedRun(cfg, resume=False, log=lambda *_: None)
    trajectories, _, _ = run.sample()  # sampled at version 0; each record carries the engine's log-probs
    pad = run.tokenizer.pad_token_id or 0
    learner = Learner(cfg, resolve_model(cfg, lambda *_: None), pad_id=pad)
    learner.train_step(trajectories)  # one update: the learner is now one version ahead of the samples
    module = learner.engine.module
    exact = padded(token_logprobs(module, trajectories, torch.float32, pad))  # the pre-pass at its weights
    rollout_v0 = padded([t.response_logprobs for t in trajectories])  # what the engine returned (version 0)
    rollout_bf16 = padded(token_logprobs(module, trajectories, torch.bfloat16, pad))  # same version, bf16
    mask = padded([[1.0] * len(t.response_token_ids) for t in trajectories]).bool()
    from learner.algorithm.advantages import grpo_advantages

    groups = {g: i for i, g in enumerate(dict.fromkeys(t.group_id for t in trajectories))}
    seq_adv = grpo_advantages(
        torch.tensor([float(t.reward) for t in trajectories]),
        torch.tensor([groups[t.group_id] for t in trajectories]),
        len(groups),
        scale_by_std=cfg.data.advantage_std,
    )
    adv = padded([[float(a)] * len(t.response_token_ids) for a, t in zip(seq_adv, trajectories)])
    uid = torch.arange(mask.numel()).reshape(mask.shape)
    frac, w = cfg.loss.top_fraction, cfg.controller.w
    pos_e, neg_e = selection(exact, adv, mask, uid, frac)
    row = {"seed": seed, "tokens": int(mask.sum())}
    omega_e = 1.0 + (w - 1.0) * pos_e.float()
    g_exact = gradient(module, trajectories, omega_e, adv, mask, pad)
    # the tolerated mismatch: truncated token IS (cap 2) of the stale, bf16 rollout against the learner
    is_w = torch.exp(exact - rollout_v0).clamp(max=2.0) * mask
    g_is = gradient(module, trajectories, omega_e * is_w, adv, mask, pad)
    row["tolerated_rel"] = float((g_is - g_exact).norm() / g_exact.norm())
    for name, keys in (("stale", rollout_v0), ("bf16", rollout_bf16)):
        pos_a, neg_a = selection(keys, adv, mask, uid, frac)
        g = gradient(module, trajectories, 1.0 + (w - 1.0) * pos_a.float(), adv, mask, pad)
        row[f"{name}_missed_pos"] = missed(pos_e, pos_a)
        row[f"{name}_missed_neg"] = missed(neg_e, neg_a)
        row[f"{name}_rel"] = float((g - g_exact).norm() / g_exact.norm())
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=Path("configs/tiny-cpu.yaml"))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    out = Path(tempfile.mkdtemp(prefix="stare-prepass-"))
    rows = []
    try:
        for seed in (int(s) for s in args.seeds.split(",")):
            rows.append(one_seed(args.config, args.overrides, seed, out))
            print(json.dumps(rows[-1]))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    keys = [k for k in rows[0] if k not in ("seed", "tokens")]
    means = {k: statistics.fmean(r[k] for r in rows) for k in keys}
    print("mean " + json.dumps({k: round(v, 4) for k, v in means.items()}))
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "mean": means}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
