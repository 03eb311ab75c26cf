"""DeepSpeed: the only module that imports it. Builds the engine, saves and loads checkpoints,
exports full weights for rollout.

On CPU the process group is gloo; without a launcher's RANK/WORLD_SIZE/MASTER_* we set a
single-process group ourselves (DeepSpeed would otherwise try MPI). The `deepspeed_shm_comm` op
compiles once (tens of seconds) into TORCH_EXTENSIONS_DIR, which defaults to stare's cache.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import torch

from stare.net import free_port
from stare.paths import cache_dir

LAUNCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def child_env() -> dict[str, str]:
    """This process's environment without the process-group variables `init_distributed` sets,
    for a child process that must form its own group."""
    return {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}


def _skip_cpu_shm_op() -> None:
    """Do not JIT-compile DeepSpeed's CPU shared-memory all-reduce op (40 s to minutes of g++).

    DeepSpeed uses it only for `inference_all_reduce`; training collectives go through
    torch.distributed (gloo). Setting the op-compatibility table before its first read also skips
    DeepSpeed's compiler probing; ops absent from it count as unavailable, and we build none
    (the optimizer is torch's AdamW)."""
    import deepspeed.ops

    if "__compatible_ops__" not in vars(deepspeed.ops):
        deepspeed.ops.__compatible_ops__ = {}
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def init_distributed(timeout_s: float = 300.0) -> None:
    """A process group for DeepSpeed: the launcher's, or a one-process gloo group on loopback."""
    import deepspeed
    import torch.distributed as dist

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(cache_dir() / "torch_extensions"))
    if dist.is_initialized():
        # An in-process engine (vLLM) formed the default group first: DeepSpeed wraps that one,
        # but reads the launcher variables, which nobody set.
        for key, value in (("RANK", dist.get_rank()), ("LOCAL_RANK", 0), ("WORLD_SIZE", dist.get_world_size())):
            os.environ.setdefault(key, str(value))
        if dist.get_backend() == "gloo":
            _skip_cpu_shm_op()
        deepspeed.init_distributed(dist_backend=dist.get_backend(), timeout=datetime.timedelta(seconds=timeout_s))
        return
    missing = [k for k in LAUNCH_ENV if k not in os.environ]
    if missing:
        if os.environ.get("WORLD_SIZE", "1") != "1":
            raise RuntimeError(f"a {os.environ['WORLD_SIZE']}-rank launch without {', '.join(missing)}: set them "
                               "(torchrun and `stare up` do), or unset WORLD_SIZE for a one-process learner")
        # one process: its own group on loopback (also when an in-process engine left some of the
        # variables set, as vLLM does; DeepSpeed would otherwise go looking for MPI)
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "gloo":
        _skip_cpu_shm_op()
    deepspeed.init_distributed(dist_backend=backend, timeout=datetime.timedelta(seconds=timeout_s))


def deepspeed_config(
    *, micro_batch: int, grad_accum: int, world_size: int, lr: float, betas: tuple[float, float],
    weight_decay: float, grad_clip: float, zero_stage: int, bf16: bool, fused_adam: bool = False,
) -> dict[str, Any]:
    """`fused_adam`: torch's fused AdamW kernel (CUDA only; no op to compile). Off on CPU, where
    torch's for-each AdamW runs."""
    params: dict[str, Any] = {"lr": lr, "betas": list(betas), "weight_decay": weight_decay, "torch_adam": True}
    if fused_adam:
        params["fused"] = True
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": micro_batch * grad_accum * world_size,
        "optimizer": {
            "type": "AdamW",
            # torch's AdamW (fused on CUDA): no DeepSpeed op to compile, on CPU or GPU.
            "params": params,
        },
        "gradient_clipping": grad_clip,
        "zero_optimization": {"stage": zero_stage},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": bf16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def build_engine(model: torch.nn.Module, config: dict[str, Any]):
    import deepspeed

    engine, _, _, _ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    return engine


def backward(engine, loss: torch.Tensor, last: bool | None = None) -> None:
    """Our micro-batch losses are already shares of the step's loss: no 1/grad_accum scaling.

    `last`: whether this is the step's last micro-batch (its number varies under token budgets);
    the gradient-accumulation boundary is set from it instead of DeepSpeed's fixed count."""
    if last is not None:
        engine.set_gradient_accumulation_boundary(last)
    engine.backward(loss, scale_wrt_gas=False)


def engine_device(engine) -> torch.device:
    """The device the engine computes on (where every tensor of a step must live)."""
    return torch.device(engine.device)


def full_state_dict(engine) -> dict[str, torch.Tensor]:
    """The whole model's weights on CPU (gathered under ZeRO-3), for the rollout engines."""
    module = engine.module
    if engine.zero_optimization_stage() == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def save_checkpoint(engine, directory: Path, tag: str) -> None:
    """The model and optimizer under directory/tag. DeepSpeed does not write `latest`: the trainer
    points it at a tag only once the tag is whole (its trainer_state.json written)."""
    engine.save_checkpoint(str(directory), tag=tag, save_latest=False)


def load_checkpoint(engine, directory: Path, tag: str) -> None:
    path, _ = engine.load_checkpoint(str(directory), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True)
    if path is None:
        raise FileNotFoundError(f"no DeepSpeed checkpoint {tag!r} under {directory}")


def grad_norm(engine) -> float | None:
    value = engine.get_global_grad_norm()
    return None if value is None else float(value)
