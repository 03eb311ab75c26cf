"""config: the run's config (`stare doctor --config`) planned by `stare plan` for this node's GPUs and compared
with the memory free on them now."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from stare.app.doctor.checks.common import cuda, gpus, tiny_model
from stare.app.doctor.registry import Check, Context, Row, timed

PEAK_TIMEOUT_S = 150

CHECKS = [
    Check(
        "config.plan",
        "`stare plan` of the run's config (--config) for this GPU's memory: every role fits, and "
        "fits in the memory free now",
        "a role needs more memory than the GPU has (the plan's fix names the field), "
        "or other processes hold the memory it needs",
        "the field the plan names (stare plan --config C shows all); free the GPU (nvidia-smi lists its processes)",
        gpu=True,
    ),
    Check(
        "config.plan_peak",
        "one learner step (DeepSpeed ZeRO-1, bf16, gradient checkpointing, chunked head) on a random "
        "Qwen2.5-0.5B-shaped model, 8 rows x 1,152 tokens: the GPU's peak memory against `stare plan`'s learner "
        "figure for the same config; tokens/s",
        "the step needs more memory than `stare plan` counts: a config the plan passes may run out of memory",
        "report it with this output; meanwhile leave more headroom than the plan asks (a smaller optim.micro_batch)",
        gpu=True,
    ),
]


def plan(ctx: Context) -> Row:
    if why := cuda():
        return Row(
            "config.plan", "skip", f"{why}: nothing to plan against (stare plan --gpu-mem-gib G plans for a GPU)"
        )
    if ctx.config is None:
        return Row("config.plan", "skip", "no run config given: stare doctor --config RUN.yaml plans it here")
    import torch

    from stare.config import load_config
    from stare.config.colocation import node_colocated
    from stare.plan.gpu_memory import build_plan
    from stare.plan.plan_items import GIB

    cfg = load_config(Path(ctx.config), overrides=list(ctx.overrides))
    mem = torch.cuda.get_device_properties(0).total_memory / GIB
    n = min(cfg.system.learner_ranks, gpus())
    free = min(torch.cuda.mem_get_info(i)[0] for i in range(gpus())) / GIB
    if node_colocated(cfg) and n > 1:
        from stare.plan.colocation import build_node_plan

        p = build_node_plan(cfg, gpus=n, gpu_mem_gib=mem)
    elif n == 1 and cfg.system.colocate != "off":
        from stare.plan.colocation import build_one_gpu_plan

        p = build_one_gpu_plan(cfg, gpu_mem_gib=mem)
    else:
        p = build_plan(cfg, gpus=n, gpu_mem_gib=mem)
    figures = {
        "gpu_gib": round(mem, 1),
        "free_gib": round(free, 1),
        **{f"{r.role.replace(' ', '_')}_gib": round(r.total / GIB, 1) for r in p.roles},
    }
    short = [
        f"the {r.role} needs {r.total / GIB:.1f} GiB, {r.usable / GIB:.1f} usable; change: "
        + "; ".join(map(str, r.fixes))
        for r in p.roles
        if not r.fits
    ]
    if short:
        return Row("config.plan", "fail", " | ".join(short), figures)
    taken = [
        f"the {r.role} needs {r.total / GIB:.1f} GiB, {free:.1f} GiB are free now"
        for r in p.roles
        if r.total / GIB > free
    ]
    if taken:
        return Row("config.plan", "fail", "; ".join(taken) + " (other processes hold the rest: nvidia-smi)", figures)
    return Row("config.plan", "pass", "", figures)


# A Qwen2.5-0.5B-shaped model (its published config; random weights: nothing downloaded) and a step's shape.
SHAPE_0_5B = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151_936,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
PEAK_ROWS, PEAK_PROMPT, PEAK_RESPONSE = 8, 128, 1024
PEAK_OVERRIDES = [
    "model.dtype=bfloat16",
    "optim.zero_stage=1",
    "optim.gradient_checkpointing=true",
    "optim.micro_batch=4",
    "optim.logits_chunk_tokens=1024",
    f"rollout.prompts_per_step={PEAK_ROWS // 4}",
    "rollout.samples_per_prompt=4",
    f"data.max_prompt_len={PEAK_PROMPT}",
    f"rollout.max_new_tokens={PEAK_RESPONSE}",
    "data.dynamic_sampling=false",
]


def plan_peak(out: Path) -> Row:
    """See CHECKS: measured in a process of its own (a one-process NCCL group on this GPU)."""
    if why := cuda():
        return Row("config.plan_peak", "skip", why)
    folder = out / "config.plan_peak"
    model = tiny_model(out / "models" / "qwen2.5-0.5b-shape", **SHAPE_0_5B)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "step.log").open("w") as log:
        proc = subprocess.run(
            [sys.executable, "-m", "stare.app.doctor.checks.config", "peak", str(model), str(folder)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=PEAK_TIMEOUT_S,
        )
    if proc.returncode != 0:
        return Row(
            "config.plan_peak", "fail", f"the step ended with code {proc.returncode} (log: {folder / 'step.log'})"
        )
    got = json.loads((folder / "peak.json").read_text())
    figures = {
        "peak_gib": round(got["peak"] / 2**30, 2),
        "plan_gib": round(got["plan"] / 2**30, 2),
        "tokens_per_s": round(got["tokens_per_s"], 1),
    }
    if got["peak"] > got["plan"]:
        return Row(
            "config.plan_peak",
            "fail",
            f"the step's peak {figures['peak_gib']} GiB is over stare plan's {figures['plan_gib']} GiB",
            figures,
        )
    return Row("config.plan_peak", "pass", "", figures)


def _peak(model: Path, folder: Path) -> None:
    import numpy as np
    import torch

    from learner.step.trainer import Learner
    from stare.config import build_config
    from stare.plan.gpu_memory import build_plan
    from stare.plan.plan_items import GIB
    from stare.plan.sizes import load_model_shape
    from stare.transport.records import Trajectory

    cfg = build_config({}, overrides=PEAK_OVERRIDES)
    learner = Learner(cfg, model, pad_id=0)
    rng, vocab = np.random.default_rng(0), SHAPE_0_5B["vocab_size"]
    trajs = [
        Trajectory(
            run_id="doctor",
            trajectory_id=f"t{i}",
            group_id=f"g{i // 4}",
            group_size=4,
            weight_version=0,
            prompt_token_ids=rng.integers(3, vocab, PEAK_PROMPT, dtype=np.int32),
            response_token_ids=rng.integers(3, vocab, PEAK_RESPONSE, dtype=np.int32),
            response_logprobs=np.full(PEAK_RESPONSE, -float(np.log(vocab)), dtype=np.float32),
            loss_mask=np.ones(PEAK_RESPONSE, dtype=np.uint8),
            finish_reason="length",
            answer="",
            problem_id=f"p{i // 4}",
            data_source="doctor",
            reward=float(i % 2),
        ).validate()
        for i in range(PEAK_ROWS)
    ]
    learner.train_step(trajs)  # warm-up: the allocator, the kernels, the optimizer state
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    learner.train_step(trajs)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    mem = torch.cuda.get_device_properties(0).total_memory
    plan = build_plan(
        cfg,
        gpus=1,
        gpu_mem_gib=mem / GIB,
        shape=load_model_shape(cfg, model / "config.json"),
        prompt_tokens=PEAK_PROMPT,
        roles=("learner",),
    )
    (folder / "peak.json").write_text(
        json.dumps(
            {
                "peak": torch.cuda.max_memory_allocated(),
                "plan": plan.roles[0].total,
                "tokens_per_s": PEAK_ROWS * (PEAK_PROMPT + PEAK_RESPONSE) / seconds,
            }
        )
    )


def run(ctx: Context, report) -> None:
    check = timed(report)
    check("config.plan", lambda: plan(ctx))
    check("config.plan_peak", lambda: plan_peak(Path(ctx.out)))


if __name__ == "__main__" and sys.argv[1:2] == ["peak"]:
    _peak(Path(sys.argv[2]), Path(sys.argv[3]))
