"""DeepSpeed: the only module that imports it. Builds the engine, saves and loads checkpoints,
exports full weights for rollout.

On CPU the process group is gloo; without a launcher's RANK/WORLD_SIZE/MASTER_* we set a
single-process group ourselves (DeepSpeed would otherwise try MPI). The `deepspeed_shm_comm` op
compiles once (tens of seconds) into TORCH_EXTENSIONS_DIR, which defaults to stare's cache.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from learner.engine.host_snapshot import HostCopies, HostSnapshot, PinnedStash, hold_updates, host_copy
from stare.runtime.net import free_port
from stare.runtime.paths import cache_dir
from stare.weight_sync.buckets import tensor_aliases

LAUNCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# fp16: DeepSpeed's dynamic loss scaling (the reference's fp16 setting): start at 2^16, halve on an
# overflowing step (which is skipped), double after 1000 clean steps.
FP16_LOSS_SCALING = {
    "loss_scale": 0,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
}


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
            raise RuntimeError(
                f"a {os.environ['WORLD_SIZE']}-rank launch without {', '.join(missing)}: set them "
                "(torchrun and `stare up` do), or unset WORLD_SIZE for a one-process learner"
            )
        # one process: its own group on loopback (also when an in-process engine left some of the
        # variables set, as vLLM does; DeepSpeed would otherwise go looking for MPI)
        os.environ.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())
        )
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":  # one GPU per rank: LOCAL_RANK among those CUDA_VISIBLE_DEVICES shows
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if backend == "gloo":
        _skip_cpu_shm_op()
    deepspeed.init_distributed(dist_backend=backend, timeout=datetime.timedelta(seconds=timeout_s))


def deepspeed_config(
    *,
    micro_batch: int,
    grad_accum: int,
    world_size: int,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    grad_clip: float,
    zero_stage: int,
    dtype: str = "float32",
    fused_adam: bool = False,
) -> dict[str, Any]:
    """`dtype`: model.dtype (bfloat16: bf16 weights with fp32 optimizer state; float16: the same with
    dynamic loss scaling). `fused_adam`: torch's fused AdamW kernel (CUDA only; no op to compile).
    Off on CPU, where torch's for-each AdamW runs."""
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
        "bf16": {"enabled": dtype == "bfloat16"},
        "fp16": {"enabled": dtype == "float16", **(FP16_LOSS_SCALING if dtype == "float16" else {})},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def inference_config(config: dict[str, Any]) -> dict[str, Any]:
    """`config` (a `deepspeed_config`) for an engine that only runs forwards: no optimizer, no gradient
    clipping; the same ZeRO stage and dtype (at stage 3 the weights are partitioned as the trained model's)."""
    return {k: v for k, v in config.items() if k not in ("optimizer", "gradient_clipping")}


def check_dtype_supported(dtype: str) -> None:
    """model.dtype against what this machine's DeepSpeed accelerator computes in (its own check
    raises a ValueError that names no config field)."""
    from deepspeed.accelerator import get_accelerator

    from stare.config import ConfigError

    supported = {"float16": get_accelerator().is_fp16_supported, "bfloat16": get_accelerator().is_bf16_supported}
    if dtype in supported and not supported[dtype]():
        raise ConfigError(
            f"model.dtype: {dtype} is not supported by DeepSpeed on this device "
            f"({get_accelerator().device_name()}); use float32 here (bfloat16/float16 on a GPU)"
        )


def build_engine(
    model: torch.nn.Module, config: dict[str, Any], *, external: dict[torch.nn.Module, torch.nn.Parameter] | None = None
):
    """`external`: module -> a parameter it uses but does not own (the learner's `ChunkedHead` and the
    output head's weight). Under ZeRO-3 DeepSpeed gathers it in that module's forward and backward
    (`register_external_parameter`); registered before `initialize`, which installs the hooks."""
    import deepspeed

    if config["zero_optimization"]["stage"] == 3:
        for module, param in (external or {}).items():
            deepspeed.zero.register_external_parameter(module, param)
    trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
    engine, _, _, _ = deepspeed.initialize(model=model, config=config, model_parameters=trainable)
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


def full_state_dict(
    engine, keep: bool = True, *, where: str = "host", snapshot: bool = True
) -> Mapping[str, torch.Tensor]:
    """The whole model's weights for the rollout engines. Under ZeRO-3 every rank must call it (each
    gather is a collective); parameters are gathered one at a time, so the device never holds more
    than its shard plus one whole parameter besides what is returned. `keep=False` (a rank that does
    not publish): take part in the gathers, copy nothing.

    where="device" (an NCCL publish): the tensors stay on the engine's device. Under ZeRO 0-2 without
    `snapshot` they are the parameters themselves (no copy: the publish must finish before the next
    update, as a synchronous one does); with `snapshot` (a background publish) one device copy each.
    Under ZeRO-3 each gathered parameter is copied on the device (its gathered memory is released).
    where="host" (gloo, filesystem): a CPU copy of each; on CUDA into pinned memory on a side stream,
    so the learner's thread does not wait: the returned `HostSnapshot` waits for the copies when it is
    first read (by the publisher, in its own thread when it publishes in the background), and the
    optimizer's next update waits for them on the GPU (`hold_updates`)."""
    module = engine.module
    device = engine_device(engine)
    host = where == "host"
    copies = HostCopies(device) if host and device.type == "cuda" else None

    def take(t: torch.Tensor, gathered: bool) -> torch.Tensor:
        t = t.detach()
        if copies is not None:
            return copies.copy(t)
        if host:
            return host_copy(t)
        return t.clone() if (gathered or snapshot) else t

    if engine.zero_optimization_stage() != 3:
        out = {}
        if keep:
            state = module.state_dict()
            aliases = tensor_aliases(state)  # tied weights: one copy, every name (the broadcast sends it once)
            for name, value in state.items():
                out[name] = out[aliases[name]] if name in aliases else take(value, False)
    else:
        import deepspeed

        named = module.state_dict(keep_vars=True)  # names -> the (partitioned) parameters and buffers
        names_of: dict[int, list[str]] = {}
        for name, tensor in named.items():
            names_of.setdefault(id(tensor), []).append(name)  # tied weights: one gather, every name
        taken: dict[str, torch.Tensor] = {}
        for names in names_of.values():
            tensor = named[names[0]]
            if not isinstance(tensor, torch.nn.Parameter) or not hasattr(tensor, "ds_id"):  # a buffer: whole everywhere
                copy = take(tensor, False) if keep else None
            else:
                with deepspeed.zero.GatheredParameters([tensor], modifier_rank=None):
                    copy = take(tensor, True) if keep else None
            if keep:
                taken.update(dict.fromkeys(names, copy))
        out = {name: taken[name] for name in named} if keep else {}
    if copies is None:
        return out
    hold_updates(engine, copies.done())
    return HostSnapshot(out, copies.event)


def loss_scale(engine) -> float | None:
    """fp16: the dynamic loss scale now (None without loss scaling)."""
    if not engine.fp16_enabled():
        return None
    return float(getattr(engine.optimizer, "cur_scale", getattr(engine.optimizer, "loss_scale", 0.0)))


def save_checkpoint(engine, directory: Path, tag: str, trainable_only: bool = False) -> None:
    """The model and optimizer under directory/tag. DeepSpeed does not write `latest`: the trainer
    points it at a tag only once the tag is whole (its trainer_state.json written). `trainable_only`
    (LoRA): the module's frozen weights are left out, the checkpoint holds the adapters."""
    engine.save_checkpoint(str(directory), tag=tag, save_latest=False, exclude_frozen_parameters=trainable_only)


def load_checkpoint(engine, directory: Path, tag: str, trainable_only: bool = False) -> None:
    path, _ = engine.load_checkpoint(
        str(directory),
        tag=tag,
        load_optimizer_states=True,
        load_lr_scheduler_states=True,
        load_module_strict=not trainable_only,
    )
    if path is None:
        raise FileNotFoundError(f"no DeepSpeed checkpoint {tag!r} under {directory}")


def grad_norm(engine) -> float | None:
    value = engine.get_global_grad_norm()
    return None if value is None else float(value)


# -- optimizer state aside while a colocated rollout engine samples (system.colocate_offload) ----


def _torch_optimizer(engine: Any) -> Any:
    """The torch optimizer whose `state` holds the Adam moments: inside DeepSpeed's ZeRO-1/2 optimizer, or
    the engine's own (ZeRO-0)."""
    return engine.optimizer.optimizer if engine.zero_optimization_stage() in (1, 2) else engine.basic_optimizer


def _stash(engine: Any) -> PinnedStash:
    stash = getattr(engine, "_stare_stash", None)
    if stash is None:
        stash = engine._stare_stash = PinnedStash(pin=torch.cuda.is_available())
    return stash


def offload_optimizer_states(engine: Any) -> str:
    """Move the optimizer's state off the engine's device (pinned host memory on CUDA) until
    `reload_optimizer_states`; returns how. Its host buffers are made once and kept across wakes.
    ZeRO 1-2: DeepSpeed's `offload_states` for the fp32 master weights and the gradient partitions (its
    pinned hp_params buffers are kept past `reload_states`, which drops them), the Adam moments into our
    `PinnedStash` (DeepSpeed's `offload_optimizer_states` pins fresh buffers at every call); the 16-bit
    weights stay (the rollout engine reads them). ZeRO-0: the torch optimizer's moments (a bf16 wrapper's
    fp32 master copy stays). ZeRO-3 is refused (DeepSpeed moves its optimizer state only for FusedAdam).
    On CPU the same calls copy into the same host buffers; nothing leaves a device."""
    from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum

    stage = engine.zero_optimization_stage()
    if stage == 3:
        from stare.config import ConfigError

        raise ConfigError(
            "system.colocate_offload: optimizer needs optim.zero_stage 0-2 (ZeRO-3 offload needs "
            "DeepSpeed's FusedAdam); set optim.zero_stage=1"
        )
    how = "the torch optimizer's state tensors"
    if stage in (1, 2):
        states = [OffloadStateTypeEnum.hp_params, OffloadStateTypeEnum.lp_grads]
        engine.offload_states(include=states, device=OffloadDeviceEnum.cpu, pin_memory=True, non_blocking=False)
        how = "deepspeed offload_states: " + ", ".join(s.value for s in states) + "; " + how
    stash = _stash(engine)
    stash.holding = True
    for index, state in enumerate(_torch_optimizer(engine).state.values()):
        for name, value in list(state.items()):
            if torch.is_tensor(value) and (value.device.type != "cpu" or not stash.pin):
                stash.put((index, name), state, name)
    if stash.pin:
        torch.cuda.empty_cache()
    return how + " (host buffers kept across wakes)"


def reload_optimizer_states(engine: Any) -> None:
    """Bring back what `offload_optimizer_states` moved; its host buffers stay for the next offload."""
    if engine.zero_optimization_stage() in (1, 2):
        kept = getattr(engine.optimizer, "hp_params_pin_buffers", None)
        engine.reload_states(non_blocking=False)
        if kept is not None:  # DeepSpeed drops them (stage_1_and_2.py reload_states); its next offload reuses them
            engine.optimizer.hp_params_pin_buffers = kept
    _stash(engine).take_back()


def offloaded_states(engine: Any) -> frozenset[str]:
    """What is in host memory now: DeepSpeed's offloaded states, and optim_states between an offload and its reload."""
    ours = {"optim_states"} if getattr(getattr(engine, "_stare_stash", None), "holding", False) else set()
    return frozenset({s.value for s in getattr(engine.optimizer, "offloaded_states", ())} | ours)


def optimizer_state_bytes(engine) -> int:
    """Bytes of the optimizer's state tensors where they live now (what an offload moves, roughly;
    the gradient partitions aside)."""
    optimizer = engine.basic_optimizer
    return sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))
