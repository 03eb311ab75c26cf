"""A rollout GPU's memory in a plan (stare/plan/gpu_memory.py).

A rollout GPU (one worker per GPU): vLLM takes gpu_memory_utilization x GPU memory; after the weights
(b P) and a reserve for its forward pass (a [max_num_seqs, V] fp32 logits buffer and one layer over
8,192 batched tokens), the rest is KV cache at 2 x layers x kv_heads x head_dim x b bytes per token.
It must hold one whole sequence (prompt + response; vLLM refuses to start otherwise) and should hold a
rollout batch (rollout_batch_prompts x samples_per_prompt sequences) to decode it without preemption.
The transformers engine keeps the KV cache of a whole rollout batch next to the weights.
When the weights arrive by NCCL broadcast (`system.weight_sync: broadcast`, communicator not gloo,
tensor_parallel_size 1) the rollout worker receives them into two whole-model buffer sets on its
GPU (one being loaded into the engine while the next version arrives: stare.weight_sync.broadcast),
2 b P outside vLLM's gpu_memory_utilization share (one set, b P, with in-flight weight updates: the
engine takes each version within a step): that share, the buffers and RECEIVE_RESERVE
(the process's CUDA context, NCCL's own buffers) must fit the GPU. Over gloo the buffers are in CPU
memory (and the filesystem backend has none).
"""

from __future__ import annotations

import math

from stare.config import TrainConfig
from stare.plan.plan_items import GIB, HEADROOM, RECEIVE_RESERVE, VLLM_PROFILE_TOKENS, Fix, Item, RolePlan
from stare.plan.sizes import (
    DTYPE_BYTES,
    ModelShape,
    kv_bytes_per_token,
)
from stare.plan.weights import weight_receive_bytes
from stare.weight_sync.factory import receive_buffer_sets


def _receive_items(recv: int, sets: int) -> list[Item]:
    what = (
        "2 whole-model buffer sets of the NCCL weight sync (one loading into the engine, one receiving the "
        "next version)"
        if sets == 2
        else "1 whole-model buffer set of the NCCL weight sync (in-flight weight "
        "updates: the engine takes each version within a step)"
    )
    return [Item("weight receive", recv, what)] if recv else []


def plan_rollout(cfg: TrainConfig, shape: ModelShape, *, gpu_mem_bytes: int, seq_tokens: int) -> RolePlan:
    b = DTYPE_BYTES[cfg.model.dtype]
    weights = b * shape.params
    recv = weight_receive_bytes(cfg, weights)
    gloo = Fix("system.weight_sync_communicator", "gloo", "receive the weights in CPU memory; slower syncs")
    per_token = kv_bytes_per_token(shape, b)
    batch_seqs = cfg.system.rollout_batch_prompts * cfg.rollout.samples_per_prompt
    per_seq = per_token * seq_tokens
    engine = cfg.rollout.engine
    if engine.name == "hf":
        items = [
            Item("weights", weights, f"{shape.params:,} params in {cfg.model.dtype}"),
            Item("KV cache", per_seq * batch_seqs, f"{batch_seqs} sequences x {seq_tokens:,} tokens x {per_token:,} B"),
            *_receive_items(recv, receive_buffer_sets(cfg)),
        ]
        plan = RolePlan(
            "rollout",
            1,
            gpu_mem_bytes,
            items,
            sum(i.bytes for i in items) <= HEADROOM * gpu_mem_bytes,
            extra={"engine": "hf", "kv_bytes_per_token": per_token, "weight_receive_bytes": recv},
        )
        if not plan.fits:
            prompts = (plan.usable - weights - recv) // (per_seq * cfg.rollout.samples_per_prompt)
            plan.fixes = (
                [Fix("system.rollout_batch_prompts", int(prompts))]
                if prompts >= 1
                else [
                    Fix("rollout.engine", "vllm", "it pages its KV cache; or shorter sequences: rollout.max_new_tokens")
                ]
            )
            if recv:
                plan.fixes.append(gloo)
        return plan
    gpu_memory_utilization, max_num_seqs = engine.gpu_memory_utilization, engine.max_num_seqs
    util_field = "rollout.engine.gpu_memory_utilization"
    budget = int(gpu_memory_utilization * gpu_mem_bytes)
    reserve = 4 * max_num_seqs * shape.vocab + VLLM_PROFILE_TOKENS * b * (4 * shape.hidden + 2 * shape.intermediate)
    kv = budget - weights - reserve
    seqs = max(kv, 0) // per_seq
    items = [
        Item("weights", weights, f"{shape.params:,} params in {cfg.model.dtype}"),
        Item(
            "forward reserve",
            reserve,
            f"[{max_num_seqs}, {shape.vocab:,}] fp32 logits + one layer over {VLLM_PROFILE_TOKENS:,} tokens",
        ),
        Item(
            "KV cache",
            max(kv, 0),
            f"{per_token:,} B/token: {seqs:,} sequences of {seq_tokens:,} tokens (a rollout batch is {batch_seqs})",
        ),
        *_receive_items(recv, receive_buffer_sets(cfg)),
    ]
    beside = gpu_mem_bytes - RECEIVE_RESERVE  # vLLM's share and the receive buffers must fit in this
    room = not recv or budget + recv <= beside
    plan = RolePlan(
        "rollout",
        1,
        gpu_mem_bytes,
        items,
        seqs >= 1 and room,
        extra={
            "engine": "vllm",
            "gpu_memory_utilization": gpu_memory_utilization,
            "kv_bytes_per_token": per_token,
            "kv_cache_bytes": max(kv, 0),
            "sequences_fit": seqs,
            "rollout_batch_sequences": batch_seqs,
            "weight_receive_bytes": recv,
        },
        usable_bytes=max(beside, budget) if recv else budget,
    )
    need = weights + reserve + per_seq * batch_seqs
    if seqs < 1:
        plan.fixes = [
            Fix(
                util_field,
                f"{math.ceil(100 * (weights + reserve + per_seq) / gpu_mem_bytes) / 100:.2f}",
                f"vLLM refuses a KV cache smaller than one {seq_tokens:,}-token sequence; or shorter sequences: "
                "rollout.max_new_tokens, data.max_prompt_len",
                relation=">=",
            )
        ]
    if not room:
        top = math.floor(100 * (beside - recv) / gpu_mem_bytes) / 100
        if top * gpu_mem_bytes >= weights + reserve + per_seq:
            plan.fixes.append(
                Fix(
                    util_field,
                    f"{top:.2f}",
                    f"the NCCL weight sync receives {recv / GIB:.1f} GiB "
                    "beside vLLM's share of the GPU; a smaller KV cache",
                    relation="<=",
                )
            )
        else:
            plan.notes.append(
                f"the NCCL weight sync's {recv / GIB:.1f} GiB of receive buffers leave vLLM too little "
                "of this GPU for one sequence: receive over gloo, or use a GPU with more memory"
            )
        plan.fixes.append(gloo)
    elif seqs < batch_seqs:
        plan.notes.append(
            f"the KV cache holds {seqs} of a rollout batch's {batch_seqs} sequences: vLLM decodes the "
            f"rest later (slower); {util_field} >= {min(need / gpu_mem_bytes, 1.0):.2f} holds them all"
        )
    return plan
