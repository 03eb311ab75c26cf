"""One fixed batch, several losses: how much does each arm's update move that batch's entropy?

Samples one batch with the given config, then for each arm builds a fresh Learner from the same
starting weights (a fresh DeepSpeed engine: ZeRO keeps fp32 master weights in the optimizer, so
reusing one engine would accumulate updates across arms), trains `--updates` steps on that batch
and prints the batch's token-mean entropy after them. This is the controlled check behind the
table in docs/embedded.md.

    python scripts/entropy_probe.py --config configs/tiny-cpu.yaml --updates 5 \\
        --arm grpo:algo=grpo-matched \\
        --arm o1-w6:loss.variant=O1,controller.band=null,controller.target=5.0,controller.w=6.0,controller.w_max=6.0 \\
        --arm c2-m03:loss.variant=C2,controller.band=null,controller.target=5.0,controller.w=1.0,controller.w_max=1.0,controller.m=0.3,controller.m_min=0.3

An arm's overrides are comma-separated KEY=VALUE pairs (no commas inside values; `algo=NAME` picks
a preset). A target above the entropy keeps STARE's gate on.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=Path("configs/tiny-cpu.yaml"))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--arm", action="append", required=True, metavar="NAME:K=V,K=V")
    p.add_argument("--updates", type=int, default=5)
    args = p.parse_args(argv)

    import torch

    from learner.step.trainer import Learner
    from stare.app.launch.embedded import EmbeddedRun
    from stare.config import load_config
    from stare.models.resolve import resolve_model

    out = Path(tempfile.mkdtemp(prefix="stare-probe-"))
    try:
        base = [*args.overrides, f"run.output_dir={out}", "run.name=probe", "task.eval_problems=4"]
        cfg = load_config(args.config, overrides=base)
        if cfg.run.threads is not None:
            torch.set_num_threads(cfg.run.threads)
        run = EmbeddedRun(cfg, resume=False, log=lambda *_: None)
        trajectories, _, _ = run.sample()
        model_path = resolve_model(cfg, lambda *_: None)
        pad = run.tokenizer.pad_token_id or 0
        print(f"batch: {len(trajectories)} trajectories; {args.updates} update(s) per arm")
        before = None
        for arm in args.arm:
            name, _, spec = arm.partition(":")
            pairs = [kv for kv in spec.split(",") if kv]
            algo = next((kv.split("=", 1)[1] for kv in pairs if kv.startswith("algo=")), None)
            arm_cfg = load_config(
                args.config, algo=algo, overrides=base + [kv for kv in pairs if not kv.startswith("algo=")]
            )
            learner = Learner(arm_cfg, model_path, pad_id=pad)
            if before is None:  # the start, measured like the arms' results
                before = _batch_entropy(learner, trajectories, pad)
                print(f"{'start':<16} entropy       {before:.4f}", flush=True)
            w_used, m_used = learner.controller.w, learner.controller.m  # the adaptive update changes them after a step
            for _ in range(args.updates):
                metrics = learner.train_step(trajectories)
            after = _batch_entropy(learner, trajectories, pad)
            print(
                f"{name:<16} entropy after {after:.4f}  change {after - before:+.4f}  gate {metrics['gate']}  "
                f"W used {w_used:.2f}  M used {m_used:.2f}",
                flush=True,
            )
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _batch_entropy(learner, trajectories, pad: int) -> float:
    """Token-mean entropy of the learner's current policy over the batch's response tokens."""
    import torch

    from learner.algorithm.step_plan import mean_entropy
    from learner.step.batch import collate, token_logprobs_and_entropy

    batch = collate(trajectories, pad_id=pad, rows=learner.rows)
    with torch.no_grad():
        logits = learner.engine(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        ).logits
        _, entropy = token_logprobs_and_entropy(logits, batch)
    return float(mean_entropy(entropy, batch.mask, "token-mean"))


if __name__ == "__main__":
    main()
