"""The one-GPU plan: `stare train` with the learner and the rollout engine on one GPU, the engine
asleep while the learner steps (`system.colocate`; the loop: stare/app/colocation/one_gpu.py).

    stare plan --config C --gpus 1 [--gpu-mem-gib G]

Two phases take turns on the GPU; each must fit in HEADROOM x its memory:

    learner step   the learner's step peak (stare.plan.learner_memory.plan_learner) as `stare train` runs it:
                   weights published through host memory, no NCCL buffers, no device snapshot;
                   + the engine asleep: vLLM at sleep level 1 keeps SLEEP_RESIDUAL (buffers outside its pool;
                   CUDA graphs offloaded too: an estimate, stare doctor measures it); the hf engine nothing.
    sampling       the learner's resident state: its model states, or with the optimizer offloaded
                   only its weights (b x P, plus b x T adapter weights with LoRA; the fp32 master
                   weights, Adam moments and gradient partitions wait in host memory; at ZeRO-0 only
                   the Adam moments move, 8 B a trained parameter)
                   + the engine awake: vLLM's whole share, gpu_memory_utilization x GPU memory
                   (weights, forward reserve, KV cache); the hf engine its weights and the KV cache
                   of one call (prompts_per_step x samples_per_prompt rows, at most max_batch_size).

`system.colocate_offload` auto offloads the optimizer only when sampling does not fit with it resident and
does with it offloaded (`offload_wanted`). Estimates of the large terms, like the rest of `stare plan`.

The node-colocated learner (`stare plan --gpus N` with system.colocate on, N > 1; `build_node_plan`) is
the same two phases per GPU with the learner's states sharded over N ranks, each engine's KV cache asked
to hold 1/N of a step's samples, `colocate_offload` auto meaning none (its runtime offloads only when told
`optimizer`), and one more item while the engine wakes under ZeRO-3 (or with LoRA): the whole model
gathered (merged) on every rank, b x P, until the engine has loaded it, unless
system.weight_sync_publish_from is host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from stare.config import ConfigError, TrainConfig
from stare.plan.learner_memory import plan_learner
from stare.plan.plan_items import (
    GIB,
    HEADROOM,
    VLLM_PROFILE_TOKENS,
    Fix,
    Item,
    Plan,
    RolePlan,
    StageStates,
    _prompt_tokens,
    _whole_plan,
)
from stare.plan.sizes import DTYPE_BYTES, ModelShape, kv_bytes_per_token, load_model_shape, lora_params

SLEEP_RESIDUAL = 1 * GIB  # vLLM asleep (level 1, graphs offloaded): kept on the GPU; estimated, doctor-checked


@dataclass
class OneGpuPlan:
    step: RolePlan  # the learner steps, the engine asleep
    sampling: RolePlan  # the engine samples, the learner's state resident or offloaded
    offload: bool  # the optimizer state goes to host memory while sampling
    stages: dict[int, StageStates]
    how: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.step.fits and self.sampling.fits


def build_one_gpu_plan(
    cfg: TrainConfig,
    *,
    gpu_mem_gib: float,
    shape: ModelShape | None = None,
    prompt_tokens: int | None = None,
    config_name: str = "",
    gpus: int = 1,
) -> Plan:
    """`stare plan --gpus 1`: the memory plan of `cfg` as a colocated `stare train` on one GPU of
    `gpu_mem_gib` GiB: roles [the learner step, sampling], `how` says what sleeps and moves when."""
    if gpus != 1:
        raise ConfigError(f"a colocated plan is for one GPU (--gpus 1), got --gpus {gpus}")
    if gpu_mem_gib <= 0:
        raise ConfigError(f"--gpu-mem-gib must be > 0, got {gpu_mem_gib}")
    shape = shape or load_model_shape(cfg)
    prompt, source = _prompt_tokens(cfg, shape, prompt_tokens)
    one = plan_one_gpu(cfg, shape, gpu_mem_bytes=int(gpu_mem_gib * GIB), seq_tokens=prompt + cfg.rollout.max_new_tokens)
    return _whole_plan(cfg, shape, prompt, source, [one.step, one.sampling], one.stages, config_name, one.how)


def build_node_plan(
    cfg: TrainConfig,
    *,
    gpus: int,
    gpu_mem_gib: float,
    shape: ModelShape | None = None,
    prompt_tokens: int | None = None,
    config_name: str = "",
) -> Plan:
    """`stare plan --gpus N` of a node-colocated config (system.colocate on): per GPU, the learner step with the
    engine asleep, then sampling with it awake beside the rank's resident learner (see the module docstring)."""
    if gpus < 2:
        return build_one_gpu_plan(
            cfg, gpu_mem_gib=gpu_mem_gib, shape=shape, prompt_tokens=prompt_tokens, config_name=config_name
        )
    if gpu_mem_gib <= 0:
        raise ConfigError(f"--gpu-mem-gib must be > 0, got {gpu_mem_gib}")
    shape = shape or load_model_shape(cfg)
    prompt, source = _prompt_tokens(cfg, shape, prompt_tokens)
    node = plan_one_gpu(
        cfg, shape, gpu_mem_bytes=int(gpu_mem_gib * GIB), seq_tokens=prompt + cfg.rollout.max_new_tokens, gpus=gpus
    )
    return _whole_plan(cfg, shape, prompt, source, [node.step, node.sampling], node.stages, config_name, node.how)


def embedded_view(cfg: TrainConfig) -> TrainConfig:
    """`cfg` as a colocated `stare train` runs it: on-policy, the weights handed over through host
    memory (no NCCL buffers, no device snapshot)."""
    c = cfg.model_copy(deep=True)
    c.system.max_staleness = 0
    c.system.weight_sync_communicator = "gloo"
    c.system.weight_sync_publish_from = "host"
    return c


def _engine_phases(
    cfg: TrainConfig, shape: ModelShape, mem: int, seq: int, gpus: int = 1
) -> tuple[list[Item], int, dict[str, Any]]:
    """The engine's items awake, its bytes asleep, and facts for the fixes (`gpus` engines share a step)."""
    b = DTYPE_BYTES[cfg.model.dtype]
    weights, per_token = b * shape.params, kv_bytes_per_token(shape, b)
    engine, r = cfg.rollout.engine, cfg.rollout
    rows = math.ceil(r.prompts_per_step * r.samples_per_prompt / gpus)  # one engine's share of a step's samples
    if engine.name == "hf":
        held = min(rows, engine.max_batch_size)
        return (
            [
                Item("engine weights", weights, f"hf: {shape.params:,} params in {cfg.model.dtype}"),
                Item(
                    "engine KV cache",
                    held * seq * per_token,
                    f"{held} rows x {seq:,} tokens x {per_token:,} B (one call's cache, freed after it)",
                ),
            ],
            0,
            {"name": "hf", "weights": weights, "per_row": seq * per_token, "rows": rows},
        )
    share = int(engine.gpu_memory_utilization * mem)
    reserve = 4 * engine.max_num_seqs * shape.vocab + VLLM_PROFILE_TOKENS * b * (
        4 * shape.hidden + 2 * shape.intermediate
    )
    kv = max(share - weights - reserve, 0)
    seqs = kv // (per_token * seq)
    items = [
        Item("engine weights", weights, f"vLLM: {shape.params:,} params in {cfg.model.dtype}"),
        Item(
            "forward reserve",
            reserve,
            f"[{engine.max_num_seqs}, {shape.vocab:,}] fp32 logits + one layer over {VLLM_PROFILE_TOKENS:,} tokens",
        ),
        Item(
            "KV cache",
            kv,
            f"{per_token:,} B/token: {seqs:,} sequences of {seq:,} tokens ("
            + (f"a step samples {rows})" if gpus == 1 else f"its share of a step: {rows})"),
        ),
    ]
    return (
        items,
        SLEEP_RESIDUAL,
        {
            "name": "vllm",
            "weights": weights,
            "reserve": reserve,
            "per_seq": per_token * seq,
            "seqs": seqs,
            "rows": rows,
            "share": share,
        },
    )


def _resident(cfg: TrainConfig, shape: ModelShape, states: int) -> tuple[int, str]:
    """The learner's bytes on the GPU while it does not step, its optimizer offloaded. ZeRO-0 moves only
    the torch optimizer's Adam moments (8 B a trained parameter; learner/engine/deepspeed_engine.py
    `offload_optimizer_states`): DeepSpeed's fp16/bf16 wrapper keeps its fp32 master copy on the GPU."""
    b = DTYPE_BYTES[cfg.model.dtype]
    lora = cfg.model.lora
    trained = lora_params(shape, lora.target_modules, lora.r) if lora is not None else shape.params
    if cfg.optim.zero_stage == 0:
        return max(states - 8 * trained, 0), "all but the Adam moments (ZeRO-0 offloads only those)"
    if lora is not None:
        return min(b * (shape.params + trained), states), f"frozen base + adapter weights in {cfg.model.dtype}"
    return min(b * shape.params, states), f"the weights in {cfg.model.dtype}"


def plan_one_gpu(
    cfg: TrainConfig, shape: ModelShape, *, gpu_mem_bytes: int, seq_tokens: int, gpus: int = 1
) -> OneGpuPlan:
    """The two phases on one GPU (`gpus` > 1: on each GPU of the node-colocated learner)."""
    mem, seq, node = gpu_mem_bytes, seq_tokens, gpus > 1
    usable = int(HEADROOM * mem)
    engine_items, asleep, e = _engine_phases(cfg, shape, mem, seq, gpus)
    asleep_note = (
        "vLLM sleep level 1: weights and CUDA graphs in pinned host memory, KV cache freed; kept: its "
        "buffers outside its pool (estimate)"
        if e["name"] == "vllm"
        else "hf: weights in host memory, no cache held"
    )
    step, stages = plan_learner(
        embedded_view(cfg),
        shape,
        gpus=gpus,
        gpu_mem_bytes=mem,
        seq_tokens=seq,
        beside=(Item("engine asleep", asleep, asleep_note),),
    )
    step.title = f"learner step, the engine asleep ({gpus} x {mem / GIB:.0f} GiB GPU)"
    more = [f for f in step.fixes if f.field == "learner GPUs"]
    if more and not node:  # more learner GPUs is no change to a one-GPU plan: say what is (adapters, or the roles)
        step.fixes = [f for f in step.fixes if f.field != "learner GPUs"]
        if cfg.model.lora is None:
            step.fixes.append(
                Fix(
                    "model.lora",
                    None,
                    "train adapters: the learner's states shrink to the frozen base and the adapters' optimizer state",
                )
            )
        step.fixes.append(
            Fix(
                "system.colocate",
                "off",
                f"the learner on GPUs of its own ({more[0].relation} "
                f"{more[0].value} learner GPUs: stare plan --gpus N), the rollout engine on others",
            )
        )
    stage = cfg.optim.zero_stage
    states = stages[stage]["bytes"]
    weights_only, what = _resident(cfg, shape, states)
    setting = cfg.system.colocate_offload
    if node and setting == "auto":  # the node-colocated learner offloads only when told (stare/app/colocation/node.py)
        setting = "none"
    if node and (stage == 3 or cfg.model.lora is not None) and cfg.system.weight_sync_publish_from != "host":
        what = "ZeRO-3: the model gathered" if cfg.model.lora is None else "LoRA: the merged model"
        engine_items.append(
            Item(
                "gathered weights",
                DTYPE_BYTES[cfg.model.dtype] * shape.params,
                f"{what} on every rank in {cfg.model.dtype} while the engine wakes, until it has "
                "loaded it (system.weight_sync_publish_from host: through host memory)",
            )
        )
    engine_total = sum(i.bytes for i in engine_items)
    can_offload = stage < 3
    if setting == "optimizer":
        offload = True
    elif setting == "none" or not can_offload:
        offload = False
    else:  # auto: only when it is needed and enough
        offload = states + engine_total > usable and weights_only + engine_total <= usable
    resident = weights_only if offload else states
    learner_item = (
        Item(
            "learner resident",
            resident,
            f"{what}; optimizer state and gradients in host memory "
            f"({(states - weights_only) / GIB:.2f} GiB moved each way per step)",
        )
        if offload
        else Item("learner resident", resident, f"its model states (ZeRO-{stage}: {stages[stage]['source']})")
    )
    items = [learner_item, *engine_items]
    sampling = RolePlan(
        "sampling",
        gpus,
        mem,
        items,
        resident + engine_total <= usable,
        title=f"sampling, the engine awake ({gpus} x {mem / GIB:.0f} GiB GPU)",
        extra={
            "engine": e["name"],
            "offload": offload,
            "engine_asleep_bytes": asleep,
            "learner_states_bytes": states,
            "learner_weights_bytes": weights_only,
        },
    )
    if not sampling.fits:
        gathered = sum(i.bytes for i in engine_items if i.name == "gathered weights")  # outside vLLM's share
        sampling.fixes = _sampling_fixes(
            cfg, e, mem, usable - gathered, states, weights_only if can_offload else states, offload, setting
        )
        if gathered:
            sampling.fixes.insert(
                0,
                Fix(
                    "system.weight_sync_publish_from",
                    "host",
                    "each rank's gathered weights through pinned host memory: no whole copy beside the waking engine",
                ),
            )
    elif e["name"] == "vllm" and e["seqs"] < e["rows"]:
        sampling.notes.append(
            f"the KV cache holds {e['seqs']} of {'an engine' if node else 'a step'}'s {e['rows']} "
            "sequences: vLLM decodes the rest as sequences finish (slower, not wrong)"
        )
    how = (
        [
            f"stare up, system.colocate on: {gpus} learner ranks, each hosting a {e['name']} engine on its GPU; the "
            f"engines sleep while the learner steps ({_gib(asleep)} kept) and wake to sample each round (rank 0's also "
            "to evaluate)",
            "each engine takes its own rank's weights in process at its wake ("
            + ("ZeRO-3: gathered on every rank, " if stage == 3 else "ZeRO 0-2: the parameters themselves, ")
            + f"{'through host memory' if cfg.system.weight_sync_publish_from == 'host' else 'on the GPU'}; "
            "update_weights: vLLM's reload_weights, then reset_prefix_cache)",
        ]
        if node
        else [
            f"stare train, system.colocate {cfg.system.colocate}: the learner and the {e['name']} engine share the GPU; "
            f"the engine sleeps while the learner steps ({_gib(asleep)} kept) and wakes to sample and evaluate",
            "the new weights go to host memory after each step and into the woken engine in place (update_weights; "
            "vLLM: reload_weights, then reset_prefix_cache)",
        ]
    ) + [
        (
            f"the learner's optimizer state ({_gib(states - weights_only)}) waits in pinned host memory while the engine "
            f"samples (system.colocate_offload {setting})"
            if offload
            else f"the learner's state stays on the GPU while the engine samples (system.colocate_offload {setting}"
            + (": it fits beside the awake engine)" if sampling.fits and setting == "auto" else ")")
        )
    ]
    if (engine := cfg.rollout.engine).name == "vllm":
        how.append(
            f"vLLM takes rollout.engine.gpu_memory_utilization {engine.gpu_memory_utilization} "
            f"x {mem / GIB:.0f} GiB = {_gib(e['share'])} when awake; the learner holds {_gib(resident)} then"
        )
    return OneGpuPlan(step, sampling, offload, stages, how)


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _sampling_fixes(
    cfg: TrainConfig, e: dict[str, Any], mem: int, usable: int, states: int, floor: int, offload: bool, setting: str
) -> list[Fix]:
    """What makes the sampling phase fit: offload the optimizer, shrink the engine's share (or batch),
    train adapters. `states`: the learner resident whole; `floor`: its least (the weights, when it may
    offload). A share is first sized beside the whole learner, else beside its weights."""
    fixes = []
    if not offload and floor < states and setting == "none":
        fixes.append(
            Fix(
                "system.colocate_offload",
                "optimizer",
                "the optimizer state waits in host memory while the engine samples",
            )
        )
    for resident in dict.fromkeys((states, floor) if setting != "none" else (states,)):
        room, aside = usable - resident, resident < states
        if e["name"] == "vllm":
            need = e["weights"] + e["reserve"] + e["per_seq"]
            top = math.floor(100 * room / mem) / 100
            if top * mem >= need:
                fixes.append(
                    Fix(
                        "rollout.engine.gpu_memory_utilization",
                        f"{top:.2f}",
                        "vLLM's share beside the "
                        "resident learner"
                        + (" with its optimizer state offloaded (colocate_offload auto does it)" if aside else "")
                        + "; it still holds one sequence's KV cache",
                        relation="<=",
                    )
                )
                break
        else:
            rows = (room - e["weights"]) // e["per_row"] if room > e["weights"] else 0
            if rows >= 1:
                fixes.append(
                    Fix(
                        "rollout.engine.max_batch_size",
                        int(rows),
                        "rows decoded at once beside the learner"
                        + (" with its optimizer state offloaded" if aside else ""),
                    )
                )
                break
    if not fixes or cfg.model.lora is None:
        fixes.append(
            Fix(
                "model.lora",
                None,
                "train adapters: the learner's optimizer state shrinks to the adapters'"
                if cfg.model.lora is None
                else "a smaller model or a GPU with more memory",
            )
        )
    return fixes
