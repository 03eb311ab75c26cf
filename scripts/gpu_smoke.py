"""GPU smoke test: the project's Learner on a randomly initialised Qwen2.5-1.5B-shaped model, then
a few steps of `stare train`; prints peak memory, tokens/s and MFU.

    python scripts/gpu_smoke.py [--out DIR]          # one GPU (scripts/gpu_smoke.sh installs the wheels)
    python scripts/gpu_smoke.py --cpu-tiny           # the same code at a tiny size on CPU (tests/test_gpu_smoke.py)

Part 1, the learner: a model built from `configs/models/qwen2.5-math-1.5b.json` with random weights
(nothing downloaded), `--steps` learner steps on `--rows` synthetic trajectories of `--seq` tokens
(`--prompt` of them prompt) in groups of 8 with 0/1 rewards, bf16, gradient checkpointing and
chunked log-probs on, through `learner.step.trainer.Learner.train_step`. The first step warms up
(allocator, kernels); tokens/s and MFU are the mean over the later steps.

    model FLOPs per token = 8 N + 8 layers x hidden x seq
        N: matmul parameters (decoder layers + the lm_head; the input embedding is a lookup);
        8 N = 2 N for the pre-pass forward (old log-probs, entropy) + 6 N for the training forward
        and backward; attention (causal: on average seq / 2 keys per query) adds 2 x 2 x hidden x
        seq / 2 per layer and forward, x 4 forwards' worth. Recomputation by gradient checkpointing
        is not counted (MFU, not hardware FLOPs utilisation).
    MFU = model FLOPs per step / step time / peak (`--peak-tflops`; 989.4 for an H100/H200's dense
        bf16; unset on other devices, and then no MFU is printed).

It also prints `stare plan`'s learner total for the same config next to the measured peak, and
times the weight publish both ways (`system.weight_sync_publish_from`): `state_dict_for_rollout`
and the broadcast's bucket packer on the learner's device (no send), from the device (tensors kept
there, large ones sent from their own memory) and from the host (pinned copies on a side stream),
checking that both give the same bytes and where they live. `--zero-stage 3` runs the learner under
ZeRO-3 (one rank: the head gathered once per micro-batch, the gathered publish).

The colocated path (`system.colocate`, docs/deploy.md "One GPU"), on the same GPU next to that
learner: a transformers rollout engine of the same model sleeps (device memory before and after:
what it freed against its weights' bytes), the learner's optimizer state goes to host memory and
back (DeepSpeed's offload_states; freed against the state's bytes), the engine wakes and samples,
sleeps again, the learner takes one more step on its reloaded state, and the engine's weights are
checked to be the ones it had. On CPU (--cpu-tiny) the same calls run and nothing moves.

Part 2, `stare train`: `--train-steps` steps of the embedded loop (the bundled arithmetic task,
a quickly built tiny model, transformers rollout) in a subprocess: its learner (DeepSpeed) and its
rollout engine (`rollout.engine.device: auto`) take the GPU when there is one, colocated
(`system.colocate=on`: the engine asleep while the learner steps). Its wall time and
last metrics are printed.

Everything goes to `--out` (gpu_smoke.json, the runs); limits: `--timeout-s` per part.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4}  # dense bf16, NVIDIA's data sheets
TINY = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 512,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
    "eos_token_id": 2,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-tiny", action="store_true", help="a tiny model on CPU, small sizes (tests)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-smoke-out")))
    p.add_argument("--model-config", type=Path, default=REPO / "configs" / "models" / "qwen2.5-math-1.5b.json")
    p.add_argument("--steps", type=int, default=3, help="learner steps (the first warms up)")
    p.add_argument("--rows", type=int, default=64, help="trajectories per step (groups of 8)")
    p.add_argument("--seq", type=int, default=4096, help="tokens per trajectory, prompt included")
    p.add_argument("--prompt", type=int, default=512, help="prompt tokens of each trajectory")
    p.add_argument("--micro-batch", type=int, default=4, help="rows per micro-batch")
    p.add_argument("--zero-stage", type=int, default=1, choices=(1, 2, 3), help="optim.zero_stage of the learner")
    p.add_argument("--train-steps", type=int, default=5, help="steps of `stare train` (0: skip part 2)")
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's peak (default: known GPUs)")
    p.add_argument("--timeout-s", type=float, default=420.0, help="limit of the `stare train` subprocess")
    args = p.parse_args(argv)
    if args.cpu_tiny:
        args.rows, args.seq, args.prompt, args.micro_batch = (
            min(args.rows, 16),
            min(args.seq, 48),
            min(args.prompt, 16),
            8,
        )
        args.train_steps = min(args.train_steps, 2)
    if not 0 < args.prompt < args.seq:
        p.error(f"--prompt ({args.prompt}) must be in (0, --seq={args.seq})")
    if args.rows % 8:
        p.error(f"--rows ({args.rows}) must be a multiple of 8 (groups of 8)")
    return args


def model_flops_per_token(shape, seq: int, tied: bool) -> float:
    """See the module docstring: 8 N + 8 layers x hidden x seq."""
    n_matmul = shape.params - (0 if tied else shape.vocab * shape.hidden)  # the lm_head is a matmul
    return 8.0 * n_matmul + 8.0 * shape.layers * shape.hidden * seq


def synthetic_trajectories(rows: int, prompt: int, response: int, vocab: int, seed: int) -> list:
    """`rows` trajectories in groups of 8: random tokens, 0/1 rewards (4 right, 4 wrong per group,
    so every advantage is +-1), rollout log-probs near the model's (a random model's are ~ -log V)."""
    import numpy as np

    from stare.transport.records import Trajectory

    rng = np.random.default_rng(seed)
    out = []
    for i in range(rows):
        g = i // 8
        out.append(
            Trajectory(
                run_id="gpu-smoke",
                trajectory_id=f"t{i}",
                group_id=f"g{g}",
                group_size=8,
                weight_version=0,
                prompt_token_ids=rng.integers(3, vocab, prompt, dtype=np.int32),
                response_token_ids=rng.integers(3, vocab, response, dtype=np.int32),
                response_logprobs=np.full(response, -float(np.log(vocab)), dtype=np.float32),
                loss_mask=np.ones(response, dtype=np.uint8),
                finish_reason="length",
                answer="",
                problem_id=f"p{g}",
                data_source="synthetic",
                reward=float(i % 8 < 4),
            ).validate()
        )
    return out


def learner_config(model_dir: Path, args: argparse.Namespace, out: Path):
    from stare.config import build_config

    dtype = "float32" if args.cpu_tiny else "bfloat16"
    return build_config(
        {
            "run": {"name": "gpu-smoke-learner", "output_dir": str(out / "runs"), "seed": 0},
            "model": {"path": str(model_dir), "dtype": dtype},
            "rollout": {
                "prompts_per_step": args.rows // 8,
                "samples_per_prompt": 8,
                "max_new_tokens": args.seq - args.prompt,
            },
            "data": {"dynamic_sampling": False},
            "optim": {
                "lr": 1e-6,
                "micro_batch": args.micro_batch,
                "zero_stage": args.zero_stage,
                "gradient_checkpointing": True,
                "logits_chunk_tokens": 1024,
            },
            "diagnostics": {"predicted_entropy_change": False},
        }
    )


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def peak_memory_bytes() -> tuple[int, str]:
    import resource

    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated(), "torch.cuda.max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "peak host RSS"


def run_learner(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

    from learner.step.trainer import Learner
    from stare.plan.gpu_memory import GIB, build_plan
    from stare.plan.sizes import shape_from_hf_config

    out = args.out
    hf = (
        Qwen2Config(**{k: v for k, v in TINY.items() if k != "architectures"})
        if args.cpu_tiny
        else AutoConfig.from_pretrained(args.model_config)
    )
    shape = shape_from_hf_config(hf, "tiny" if args.cpu_tiny else str(args.model_config))
    cuda = torch.cuda.is_available()
    dtype = torch.float32 if args.cpu_tiny else torch.bfloat16
    model_dir = out / "random-model"
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(hf, dtype=dtype)
    model.save_pretrained(model_dir)  # the Learner loads a model directory, as in a real run
    del model
    t_model = time.perf_counter() - t0

    cfg = learner_config(model_dir, args, out)
    t0 = time.perf_counter()
    learner = Learner(cfg, model_dir, pad_id=0)
    t_setup = time.perf_counter() - t0
    module = learner.engine.module
    checkpointing = any(getattr(m, "gradient_checkpointing", False) is True for m in module.modules())
    trajectories = synthetic_trajectories(args.rows, args.prompt, args.seq - args.prompt, shape.vocab, seed=0)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    step_s, metrics = [], []
    for _ in range(args.steps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        m = learner.train_step(trajectories)
        if cuda:
            torch.cuda.synchronize()
        step_s.append(time.perf_counter() - t0)
        metrics.append({k: m[k] for k in ("loss", "entropy", "grad_norm", "train_tokens") if k in m})
    peak, peak_source = peak_memory_bytes()
    timed = step_s[1:] or step_s
    mean_s = sum(timed) / len(timed)
    tokens = args.rows * args.seq
    flops = model_flops_per_token(shape, args.seq, bool(getattr(hf, "tie_word_embeddings", False))) * tokens
    peak_tflops = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in device_name()), None)
    mem = torch.cuda.get_device_properties(0).total_memory if cuda else 80 * GIB
    plan = build_plan(cfg, gpus=1, gpu_mem_gib=mem / GIB, shape=shape, prompt_tokens=args.prompt, roles=("learner",))
    result = {
        "device": device_name(),
        "params": shape.params,
        "rows": args.rows,
        "seq": args.seq,
        "micro_batch": args.micro_batch,
        "dtype": str(dtype).removeprefix("torch."),
        "gradient_checkpointing_on_model": checkpointing,
        "model_build_s": t_model,
        "learner_setup_s": t_setup,
        "step_s": step_s,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / mean_s,
        "model_tflops_per_step": flops / 1e12,
        "achieved_tflops": flops / mean_s / 1e12,
        "peak_tflops": peak_tflops,
        "mfu": (flops / mean_s / 1e12 / peak_tflops) if peak_tflops else None,
        "peak_memory_bytes": peak,
        "peak_memory_source": peak_source,
        "plan_learner_bytes": plan.roles[0].total,
        "plan_fits": plan.roles[0].fits,
        "metrics": metrics,
        "zero_stage": args.zero_stage,
        "publish": publish_check(learner),
        "colocate": colocate_check(learner, model_dir, trajectories, cfg.model.dtype),
    }
    del learner
    if cuda:
        torch.cuda.empty_cache()
    return result


def publish_check(learner) -> dict:
    """The weight publish from the device and from the host: seconds to build the state and to pack
    it into the broadcast's messages on the learner's device (what an NCCL send reads), where the
    tensors live, and whether both ways give the same bytes."""
    import torch

    from stare.weight_sync.buckets import BucketPacker

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    packer = BucketPacker(256 * 2**20, learner.device)
    out, states = {}, {}
    for where in ("device", "host"):
        learner.publish_from = where
        sync()
        t0 = time.perf_counter()
        state = learner.state_dict_for_rollout()
        tensors = dict(state)  # a host snapshot waits for its copies on the first read
        t_state = time.perf_counter() - t0
        t0 = time.perf_counter()
        n = sum(m.payload.numel() for m in packer.messages(state, packer.layout(state)))
        sync()
        out[where] = {
            "state_s": t_state,
            "pack_s": time.perf_counter() - t0,
            "bytes": n,
            "devices": sorted({str(t.device) for t in tensors.values()}),
            "pinned": all(t.is_pinned() for t in tensors.values()) if cuda and where == "host" else None,
        }
        states[where] = tensors
    out["same_bytes"] = all(torch.equal(states["device"][k].cpu(), states["host"][k].cpu()) for k in states["host"])
    return out


def colocate_check(learner, model_dir: Path, trajectories: list, dtype: str) -> dict:
    """The colocated cycle with a transformers engine on the learner's device (see the module docstring)."""
    import torch

    from learner.engine import deepspeed_engine as ds
    from rollout.engines.base import SamplingParams
    from rollout.engines.hf_engine import HFEngine

    cuda = torch.cuda.is_available()

    def allocated() -> int:
        if not cuda:
            return 0
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()

    engine = HFEngine(str(model_dir), dtype=dtype, device="cuda" if cuda else "cpu")
    tensors = engine._tensors()
    kept = {k: tensors[k].detach().to("cpu", copy=True) for k in list(tensors)[:2] + list(tensors)[-2:]}
    out: dict = {
        "engine_weight_bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
        "optimizer_state_bytes": ds.optimizer_state_bytes(learner.engine),
    }
    m0 = allocated()
    t0 = time.perf_counter()
    engine.sleep()
    out["sleep_s"], m1 = time.perf_counter() - t0, allocated()
    t0 = time.perf_counter()
    zero3 = learner.engine.zero_optimization_stage() == 3  # refused there (system.colocate_offload): not offloaded
    out["offload"] = "not at ZeRO-3" if zero3 else ds.offload_optimizer_states(learner.engine)
    out["offload_s"], m2 = time.perf_counter() - t0, allocated()
    t0 = time.perf_counter()
    engine.wake()
    out["wake_s"], m3 = time.perf_counter() - t0, allocated()
    params = SamplingParams(n=2, max_new_tokens=8, seed=0)
    sample = engine.generate([[3, 4, 5, 6, 7, 8, 9, 10]], params)[0]
    engine.sleep()
    t0 = time.perf_counter()
    if not zero3:
        ds.reload_optimizer_states(learner.engine)
    out["reload_s"], m4 = time.perf_counter() - t0, allocated()
    step = learner.train_step(trajectories)  # on the reloaded optimizer state
    engine.wake()
    restored = all(torch.equal(engine._tensors()[k].detach().cpu(), v) for k, v in kept.items())
    out.update(
        engine_freed_bytes=m0 - m1,
        optimizer_freed_bytes=m1 - m2,
        engine_woken_bytes=m3 - m2,
        optimizer_reloaded_bytes=m4 - m1,
        sampled_tokens=sum(len(c.token_ids) for c in sample),
        sample_logprobs_finite=all(math.isfinite(x) for c in sample for x in c.logprobs),
        step_after_reload_loss=step["loss"],
        weights_restored=restored,
        measured="torch.cuda.memory_allocated" if cuda else "CPU: nothing moves",
    )
    engine.close()
    return out


def run_train(args: argparse.Namespace) -> dict:
    """`stare train` for a few steps in a subprocess, with a quickly built tiny model."""
    from learner.engine.deepspeed_engine import child_env  # without this process's process-group variables
    from stare.app.cli import default_config_path
    from stare.models.tiny import build_tiny_model

    out = args.out
    t0 = time.perf_counter()
    model_dir = build_tiny_model(out / "tiny-model", sft_max_steps=30, sft_target_accuracy=2.0, n_val=16, n_eval=16)
    t_build = time.perf_counter() - t0
    name, steps = "gpu-smoke-train", args.train_steps
    cmd = [
        sys.executable,
        "-m",
        "stare.app.cli",
        "train",
        "--config",
        str(default_config_path()),  # logs: not a terminal
        "--set",
        f"model.path={model_dir}",
        "--set",
        f"run.steps={steps}",
        "--set",
        f"run.checkpoint_every={steps}",
        "--set",
        f"run.output_dir={out / 'runs'}",
        "--set",
        f"run.name={name}",
        "--set",
        "control_plane.serve_in_train=false",
        "--set",
        "task.eval_problems=16",
        "--set",
        "task.eval_k=1",
        "--set",
        f"task.eval_every={steps}",
        "--set",
        "system.colocate=on",
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s, cwd=out, env=child_env())
    wall = time.perf_counter() - t0
    (out / "stare-train.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(
            f"stare train exited {proc.returncode}; the end of its log:\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    lines = (out / "runs" / name / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    last = rows[-1]
    return {
        "steps": len(rows),
        "wall_s": wall,
        "tiny_model_build_s": t_build,
        "colocated": "colocated: the hf engine sleeps while the learner steps" in proc.stdout + proc.stderr,
        "learn_s_per_step": sum(r.get("time_learn_s", 0.0) for r in rows) / len(rows),
        "last": {k: last.get(k) for k in ("step", "reward_mean", "entropy", "loss", "grad_norm") if k in last},
    }


def render(result: dict) -> str:
    lines = []
    if "learner" in result:
        r = result["learner"]
        gib = 2**30
        lines += [
            f"learner on {r['device']}: {r['params'] / 1e6:,.1f}M params, {r['rows']} x {r['seq']:,} tokens per step, "
            f"micro-batch {r['micro_batch']}, {r['dtype']}, gradient checkpointing on the model: "
            f"{r['gradient_checkpointing_on_model']}",
            f"  steps (s): {', '.join(f'{s:.2f}' for s in r['step_s'])}  (model built in {r['model_build_s']:.1f} s, "
            f"learner set up in {r['learner_setup_s']:.1f} s)",
            f"  tokens/s: {r['tokens_per_s']:,.0f}   model TFLOP/s: {r['achieved_tflops']:.1f}   MFU: "
            + (f"{r['mfu']:.1%} of {r['peak_tflops']:.0f}" if r["mfu"] is not None else "n/a (no --peak-tflops)"),
            f"  peak memory: {r['peak_memory_bytes'] / gib:.2f} GiB ({r['peak_memory_source']}); stare plan: "
            f"{r['plan_learner_bytes'] / gib:.2f} GiB",
            "  loss, grad norm per step: "
            + ", ".join(
                f"{m.get('loss', float('nan')):.4f} {m.get('grad_norm') or float('nan'):.3g}" for m in r["metrics"]
            ),
        ]
        pub = r.get("publish") or {}
        for where in ("device", "host"):
            if where in pub:
                w = pub[where]
                lines.append(
                    f"  publish from the {where} (ZeRO-{r['zero_stage']}): state {w['state_s']:.2f} s, pack "
                    f"{w['pack_s']:.2f} s, {w['bytes'] / gib:.2f} GiB on {', '.join(w['devices'])}"
                    + (f", pinned: {w['pinned']}" if w["pinned"] is not None else "")
                )
        if pub:
            lines.append(f"  publish: device and host give the same bytes: {pub['same_bytes']}")
        if c := r.get("colocate"):
            lines += [
                f"  colocated (hf engine; {c['measured']}): asleep freed {c['engine_freed_bytes'] / gib:.2f} of "
                f"{c['engine_weight_bytes'] / gib:.2f} GiB ({c['sleep_s']:.2f} s), woke {c['engine_woken_bytes'] / gib:.2f} "
                f"({c['wake_s']:.2f} s); optimizer offload freed {c['optimizer_freed_bytes'] / gib:.2f} of "
                f"{c['optimizer_state_bytes'] / gib:.2f} GiB ({c['offload_s']:.2f} s), reloaded "
                f"{c['optimizer_reloaded_bytes'] / gib:.2f} ({c['reload_s']:.2f} s)",
                f"  after the cycle: weights restored {c['weights_restored']}, log-probs finite "
                f"{c['sample_logprobs_finite']}, a step on the reloaded state: loss {c['step_after_reload_loss']:.4f}",
            ]
    if "train" in result:
        t = result["train"]
        lines.append(
            f"stare train ({'colocated' if t.get('colocated') else 'NOT colocated'}): {t['steps']} steps in "
            f"{t['wall_s']:.1f} s (tiny model built in "
            f"{t['tiny_model_build_s']:.1f} s), learner {t['learn_s_per_step']:.2f} s/step, last: {t['last']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("STARE_CACHE_DIR", str(args.out / "cache"))
    result: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
    t0 = time.perf_counter()
    result["learner"] = run_learner(args)
    (args.out / "gpu_smoke.json").write_text(json.dumps(result, indent=1))
    print(render(result), flush=True)
    if args.train_steps > 0:
        result["train"] = run_train(args)
    result["wall_s"] = time.perf_counter() - t0
    (args.out / "gpu_smoke.json").write_text(json.dumps(result, indent=1))
    if "train" in result:
        print(render({"train": result["train"]}), flush=True)
    print(f"total {result['wall_s']:.1f} s; {args.out / 'gpu_smoke.json'}", flush=True)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
