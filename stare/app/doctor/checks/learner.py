"""learner: one step of the project's learner under ZeRO-3 on 2 ranks, driven as `stare learner` drives them
(a PREPARE op: the pre-pass ahead of the step; a TRAIN op; the WEIGHTS op gathering the model), with the
chunked output head, gradient checkpointing and packed token-budget micro-batches, against the same step on
one rank without ZeRO; and a LoRA merge against W + (alpha / r) B A computed here.

    python -m stare.app.doctor.checks.learner rank RANK PORT MODEL OUT    (one rank of the 2-rank step)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from stare.app.doctor.checks.common import TINY, cuda, gpus, missing, tiny_model
from stare.app.doctor.registry import Check, Context, Row, timed

if TYPE_CHECKING:
    pass

OVERRIDES = [
    "rollout.prompts_per_step=4",
    "rollout.samples_per_prompt=4",
    "optim.micro_batch=4",
    "optim.lr=1e-3",
    "optim.grad_clip=1000",
    "controller.target=6",
    "optim.gradient_checkpointing=true",
    "optim.max_tokens_per_micro_batch=96",
    "optim.pack_sequences=true",
    "optim.logits_chunk_tokens=16",
]
# The 2-rank ZeRO-3 step against the 1-rank step (fp32): the loss to the rounding of another reduction order (cuda:
# other kernels too). The weights within two updates: Adam's first step moves each weight by ~lr x sign(gradient),
# so where a gradient is near zero a rounding difference may flip it (2 lr); a shard gathered wrong is off by the
# weight's own size (~0.02-0.2 here, against lr 1e-3).
LOSS_RTOL = {"cpu": 1e-5, "cuda": 1e-4}
UPDATE_BOUND = 2.5
RANK_TIMEOUT_S = 240  # a cap for a loaded machine: the step takes ~35 s on a quiet 2-core one

CHECKS = [
    Check(
        "learner.zero3_gloo",
        "a learner step on 2 ranks over gloo (CPU) under ZeRO-3 with the chunked head, the "
        "pre-pass, gradient checkpointing and packing, as `stare learner` drives ranks; its weights equal the 1-rank "
        "step's",
        "DeepSpeed's ZeRO-3, the rank ops or the step's collectives are broken with this DeepSpeed/torch",
        "install the DeepSpeed stare pins; report it with the rank logs in the doctor's folder",
    ),
    Check(
        "learner.zero3_nccl",
        "the same step on GPUs 0 and 1 over NCCL",
        "ZeRO-3 over NCCL fails or gives other weights on this node",
        "see topology.nccl; optim.zero_stage 1-2 while it is looked into",
        gpu=True,
    ),
    Check(
        "learner.lora_merge",
        "the LoRA merge the engines load equals W + (alpha / r) B A for every adapted weight",
        "the merged weights are wrong: engines sample from another model than the learner trains",
        "install the peft stare pins (pip install 'stare[lora]'); report it",
    ),
]


def trajectories(seed: int = 0, groups: int = 4, group_size: int = 4) -> list:
    """Scored trajectories with mixed rewards in every group and lengths that need packing."""
    import numpy as np

    from stare.transport.records import Trajectory

    rng = np.random.default_rng(seed)
    vocab, out = TINY["vocab_size"], []
    for g in range(groups):
        for s in range(group_size):
            p, r = int(rng.integers(2, 9)), int(rng.integers(3, 30))
            out.append(
                Trajectory(
                    run_id="doctor",
                    trajectory_id=f"{g}-{s}",
                    group_id=f"g{g}",
                    group_size=group_size,
                    weight_version=0,
                    prompt_token_ids=rng.integers(3, vocab, p).astype(np.int32),
                    response_token_ids=rng.integers(3, vocab, r).astype(np.int32),
                    response_logprobs=-rng.random(r).astype(np.float32) * 5,
                    loss_mask=np.ones(r, dtype=np.uint8),
                    finish_reason="stop",
                    answer="",
                    problem_id=str(g),
                    data_source="doctor",
                    reward=float((s + g) % 2),
                ).validate()
            )
    return out


def _reference(model: Path) -> dict:
    """The same step on one rank, ZeRO-0, on the CPU (in this process): its metrics, the weights before and after."""

    from learner.step.trainer import Learner
    from stare.config import build_config

    learner = Learner(build_config({}, overrides=OVERRIDES + ["optim.zero_stage=0"]), model, pad_id=0)
    before = {k: v.detach().cpu().float().clone() for k, v in learner.state_dict_for_rollout().items()}
    metrics = learner.train_step(trajectories())
    after = {k: v.detach().cpu().float() for k, v in learner.state_dict_for_rollout().items()}
    return {"metrics": metrics, "before": before, "after": after}


def zero3(name: str, device: str, out: Path, model: Path, reference) -> Row:
    import torch

    from stare.runtime.net import free_port

    port, folder = free_port(), out / name
    folder.mkdir(parents=True, exist_ok=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    procs = []
    for rank in (0, 1):
        log = (folder / f"rank{rank}.log").open("w")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "stare.app.doctor.checks.learner",
                    "rank",
                    str(rank),
                    str(port),
                    str(model),
                    str(folder),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        )
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=RANK_TIMEOUT_S))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(f"killed after {RANK_TIMEOUT_S} s")
    if codes != [0, 0]:
        return Row(name, "fail", f"the ranks ended with {codes} (logs: {folder})")
    got = torch.load(folder / "leader.pt")
    ref = reference()
    moved = max(float((v - ref["before"][k]).abs().max()) for k, v in ref["after"].items())  # the largest update
    err = max(float((got["weights"][k].float() - v).abs().max()) for k, v in ref["after"].items())
    m, r = got["metrics"], ref["metrics"]
    figures = {
        "step_s": round(got["step_s"], 2),
        "loss": m["loss"],
        "loss_1rank": r["loss"],
        "grad_norm": m["grad_norm"],
        "weight_err": err,
        "update": moved,
    }
    problems = []
    if abs(m["loss"] - r["loss"]) > LOSS_RTOL[device] * abs(r["loss"]) + 1e-7:
        problems.append(f"loss {m['loss']:.6g} against {r['loss']:.6g} on one rank")
    if err > UPDATE_BOUND * moved:
        problems.append(
            f"the gathered weights differ from the 1-rank step's by {err:.2g} (its largest update: "
            f"{moved:.2g}): a shard gathered wrong"
        )
    return Row(name, "fail" if problems else "pass", "; ".join(problems), figures)


def _rank(rank: int, port: int, model: Path, folder: Path) -> None:
    import torch

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    from learner.process.rank_launch import leave_process_groups
    from learner.process.ranks import LeaderLearner, RankChannel, follow
    from learner.step.trainer import Learner
    from stare.config import build_config

    learner = Learner(build_config({}, overrides=OVERRIDES + ["optim.zero_stage=3"]), model, pad_id=0)
    channel = RankChannel(timeout_s=RANK_TIMEOUT_S, heartbeat_s=5.0)
    if rank > 0:
        follow(learner, channel)
        leave_process_groups()
        return
    leader = LeaderLearner(learner, channel)
    trajs = trajectories()
    leader.prepare(trajs)  # the pre-pass ahead of the step, spread over the ranks
    t0 = time.perf_counter()
    metrics = leader.train_step(trajs)
    step_s = time.perf_counter() - t0
    state = leader.state_dict_for_rollout()  # the WEIGHTS op: ZeRO-3 gathers every parameter
    weights = {k: v.detach().cpu() for k, v in state.items()}
    leader.close()
    leave_process_groups()
    torch.save({"metrics": metrics, "weights": weights, "step_s": step_s}, folder / "leader.pt")


def lora_merge(model: Path) -> Row:
    import torch

    if why := missing("peft"):
        return Row("learner.lora_merge", "skip", why)
    from transformers import AutoModelForCausalLM

    from learner.engine.lora import merged_state_dict, wrap

    r, alpha = 4, 8
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    original = {k: v.clone() for k, v in base.state_dict().items()}
    peft_model = wrap(base, {"r": r, "alpha": alpha, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]})
    g = torch.Generator().manual_seed(3)
    adapters = {}
    for name, module in peft_model.get_base_model().named_modules():
        if hasattr(module, "lora_B") and "default" in module.lora_B:
            module.lora_B["default"].weight.data = torch.randn(module.lora_B["default"].weight.shape, generator=g)
            adapters[f"{name}.weight"] = (
                module.lora_A["default"].weight.detach(),
                module.lora_B["default"].weight.detach(),
            )
    merged = merged_state_dict(peft_model, "host")
    err, worst = 0.0, ""
    for name, value in original.items():
        want = value + (alpha / r) * adapters[name][1] @ adapters[name][0] if name in adapters else value  # W + s B A
        e = float((merged[name] - want).abs().max())
        if e > err:
            err, worst = e, name
    figures = {"adapted": len(adapters), "max_err": err}
    if set(merged) != set(original) or not adapters:
        return Row("learner.lora_merge", "fail", "the merged state's names are not the base model's", figures)
    if err > 1e-5:
        return Row("learner.lora_merge", "fail", f"{worst} differs from W + (alpha / r) B A by {err:.2g}", figures)
    return Row("learner.lora_merge", "pass", "", figures)


def run(ctx: Context, report) -> None:
    check = timed(report)
    out = Path(ctx.out)
    model = tiny_model(out / "models" / "model-v0")
    cached: dict = {}

    def reference():
        if "ref" not in cached:
            cached["ref"] = _reference(model)
        return cached["ref"]

    check("learner.zero3_gloo", lambda: zero3("learner.zero3_gloo", "cpu", out, model, reference))
    why = cuda() or (None if gpus() >= 2 else f"{gpus()} GPU: NCCL refuses two ranks on one GPU")
    if why:
        report(Row("learner.zero3_nccl", "skip", why))
    else:
        check("learner.zero3_nccl", lambda: zero3("learner.zero3_nccl", "cuda", out, model, reference))
    check("learner.lora_merge", lambda: lora_merge(model))


if __name__ == "__main__" and sys.argv[1:2] == ["rank"]:
    _rank(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5]))
