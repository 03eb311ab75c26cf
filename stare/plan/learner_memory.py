"""A learner GPU's memory in a plan (stare/plan/gpu_memory.py).

Per learner GPU (ZeRO data parallel over `gpus` ranks, micro-batches of T tokens):

    model states   DeepSpeed's own estimators for mixed precision (16-bit weights, fp32 master and Adam):
                   ZeRO-2 `estimate_zero2_model_states_mem_needs` = 2P + 18P/N, ZeRO-3
                   `estimate_zero3_model_states_mem_needs` = 4 x largest layer + 18P/N (no offload).
                   DeepSpeed has none for stages 0 and 1: ZeRO-0 is ZeRO-2 on one GPU (20P), ZeRO-1
                   keeps 16-bit weights and gradients whole and shards the fp32 state: 4P + 16P/N.
                   fp32 training (no master copy): weights 4P, gradients 4P, Adam 8P; ZeRO-1 shards
                   Adam (8P + 8P/N), ZeRO-2 gradients too (4P + 12P/N), ZeRO-3 all (16P/N + 4 x largest).
    activations    what autograd saves per token and decoder layer (b = bytes of the model dtype), HF's
                   Qwen2/Llama layer as written, SDPA/flash attention (no [L, L] scores):
                       two RMSNorms: fp32 input (4h), 1/rms (4), normalised (b h), x weight (b h) each
                       attention: q (b h), k and v (2 b kv_dim), log-sum-exp (4 heads), output (b h)
                       SwiGLU MLP: gate, up, silu(gate), silu(gate) x up (4 b I)
                       a_layer = 2 (4h + 4 + 2 b h) + b (2h + 2 kv_dim) + 4 heads + 4 b I
                   (tests/test_plan.py measures it with autograd's saved-tensor hooks)
                   without checkpointing: T x layers x a_layer; with it: T x (layers x b h + a_layer)
                   (each layer's input kept, one layer recomputed at a time).
    logits         the model's [T, V] logits in its dtype and their gradient: 2 b T V.
    log-prob chunk [chunk, V] fp32 tensors alive at once in learner/step/logprobs.py (tests count them): two
                   (log p and p; the logits turned into log p, then into their gradient, in place):
                   8 chunk V, also under ZeRO-3, whose head is gathered once per micro-batch.
    reference      loss.ref_kl: the frozen base model (learner/step/reference.py): ZeRO 0-2 whole, b P; ZeRO-3
                   sharded, b P / N + 2 b x largest layer (gathered and prefetched); LoRA none (adapters off).
    diagnostics    diagnostics.predicted_entropy_change: the pre-pass upcasts the response logits to fp32
                   and takes their log-softmax, [T_response, V] each: 8 T_response V.
    weight send    NCCL weight sync (rank 0, beside the next step when it publishes in the background):
                   two system.weight_sync_bucket_mb buckets; published from the host, also the two
                   messages in flight, each up to a whole large tensor copied to the GPU: 2 bucket
                   + 2 b largest layer (from the device large tensors are sent from their own memory).
    weight snapshot published from the device (system.weight_sync_publish_from), rank 0: under ZeRO-3
                   the gathered copy of the whole model, b P; published in the background
                   (max_staleness >= 1) a copy being sent and the next one: 2 b P.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from stare.config import TrainConfig
from stare.plan.plan_items import GIB, HEADROOM, Fix, Item, RolePlan, StageStates
from stare.plan.sizes import (
    CHUNK_TENSORS,
    DTYPE_BYTES,
    ModelShape,
    activation_bytes,
    lora_params,
    model_state_bytes,
)
from stare.plan.weights import _publish_from, reference_bytes, weight_send_bytes, weight_snapshot_bytes


def plan_learner(
    cfg: TrainConfig,
    shape: ModelShape,
    *,
    gpus: int,
    gpu_mem_bytes: int,
    seq_tokens: int,
    beside: tuple[Item, ...] = (),
) -> tuple[RolePlan, dict[int, StageStates]]:
    """`beside`: what else holds memory on the learner's GPU while it steps (a sleeping engine)."""
    o = cfg.optim
    b = DTYPE_BYTES[cfg.model.dtype]
    stages: dict[int, StageStates] = {}
    for stage in (0, 1, 2, 3):
        value, source = model_state_bytes(
            shape.params, shape.largest_layer_params, stage=stage, gpus=gpus, dtype_bytes=b
        )
        stages[stage] = {"bytes": value, "source": source}
    if (lora := cfg.model.lora) is not None:  # frozen base whole on every GPU; weights, grads, Adam of the adapters
        t = lora_params(shape, lora.target_modules, lora.r)
        stages = {
            stage: {
                "bytes": b * shape.params + 16 * t,
                "source": f"LoRA r={lora.r}: frozen base {b}P + "
                f"16 B x {t:,} adapter parameters (weights, grads, fp32 Adam)",
            }
            for stage in stages
        }
    rows = math.ceil(cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt / gpus)
    budget = getattr(o, "max_tokens_per_micro_batch", None)
    micro_rows = min(o.micro_batch, rows)
    tokens = max(budget, seq_tokens) if budget is not None else micro_rows * seq_tokens
    tokens_field = "optim.max_tokens_per_micro_batch" if budget is not None else "optim.micro_batch"
    ckpt = bool(getattr(o, "gradient_checkpointing", False))
    chunk = min(getattr(o, "logits_chunk_tokens", tokens), tokens)
    diag = cfg.diagnostics.predicted_entropy_change
    response = cfg.rollout.max_new_tokens
    act = {c: activation_bytes(shape, b, tokens, checkpointing=c) for c in (False, True)}
    snapshot = weight_snapshot_bytes(cfg, shape, b, 3)[0]  # nonzero: a device snapshot at some stage

    def items_for(stage: int, checkpointing: bool, t: int, ch: int, diag_on: bool, snap: bool = True) -> list[Item]:
        out = [
            Item("model states", stages[stage]["bytes"], f"ZeRO-{stage} over {gpus} GPU(s): {stages[stage]['source']}"),
            Item(
                "activations",
                activation_bytes(shape, b, t, checkpointing=checkpointing),
                f"{t:,} tokens per micro-batch, gradient checkpointing {'on' if checkpointing else 'off'}",
            ),
            Item("logits + grad", 2 * b * t * shape.vocab, f"[{t:,}, {shape.vocab:,}] in {cfg.model.dtype}, twice"),
            Item(
                "log-prob chunk",
                4 * CHUNK_TENSORS[stage == 3] * ch * shape.vocab,
                f"{CHUNK_TENSORS[stage == 3]} x fp32 [{ch:,}, {shape.vocab:,}]"
                + (" (ZeRO-3: the head gathered once per micro-batch)" if stage == 3 else ""),
            ),
        ]
        ref, ref_why = reference_bytes(cfg, shape, b, stage, gpus)
        if ref:
            out.append(Item("reference model", ref, ref_why))
        if diag_on:
            r = t * response // seq_tokens  # response tokens of the micro-batch
            out.append(Item("diagnostics", 8 * r * shape.vocab, f"2 x fp32 [{r:,}, {shape.vocab:,}] in the pre-pass"))
        from_host = not snap or _publish_from(cfg) == "host"  # snap False: the publish_from=host fix applied
        sent = weight_send_bytes(cfg, shape, b, "host" if from_host else "device")
        if sent:
            out.append(
                Item(
                    "weight send",
                    sent,
                    f"NCCL weight sync on rank 0: 2 buckets of "
                    f"{cfg.system.weight_sync_bucket_mb} MiB"
                    + (" + the 2 largest tensors in flight" if from_host else ""),
                )
            )
        held, why = weight_snapshot_bytes(cfg, shape, b, stage)
        if held and snap:
            out.append(Item("weight snapshot", held, why))
        return out + list(beside)

    usable = int(HEADROOM * gpu_mem_bytes)

    def fits(items: list[Item]) -> bool:
        return sum(i.bytes for i in items) <= usable

    items = items_for(o.zero_stage, ckpt, tokens, chunk, diag)
    plan = RolePlan(
        "learner",
        gpus,
        gpu_mem_bytes,
        items,
        fits(items),
        extra={
            "tokens_per_micro_batch": tokens,
            "rows_per_rank": rows,
            "micro_batch_rows": micro_rows,
            "activations_no_checkpointing": act[False],
            "activations_checkpointing": act[True],
            "gradient_checkpointing": ckpt,
            "logits_chunk_tokens": chunk,
        },
    )
    if plan.fits:
        return plan, stages
    # What to change: first what the model states need, then the cheapest changes that make the rest
    # fit (each kept only if the others do not already suffice), then the micro-batch size.
    fixes = plan.fixes
    stage, t = o.zero_stage, tokens
    if stages[stage]["bytes"] > usable:
        if stage < 3 and gpus > 1 and stages[3]["bytes"] < stages[stage]["bytes"]:
            stage = 3
            fixes.append(Fix("optim.zero_stage", 3, f"model states {stages[3]['bytes'] / GIB:.1f} GiB per GPU"))
        if stages[stage]["bytes"] > usable:
            rest = sum(i.bytes for i in items_for(stage, True, seq_tokens, min(chunk, seq_tokens), False, False)[1:])
            need = _gpus_for_states(shape, b, usable - rest)
            if snapshot:  # not sharded: the GPU count holds the rest only without it
                fixes.append(Fix("system.weight_sync_publish_from", "host", _SNAPSHOT_FIX))
            why = (
                f"model states alone need {stages[stage]['bytes'] / GIB:.1f} GiB per GPU of {usable / GIB:.1f} usable; "
                f"{need or 'no number of'} GPUs at optim.zero_stage=3 with gradient checkpointing and one sequence "
                "per micro-batch hold them (--gpus, learner ranks); or a smaller model (model.path)"
            )
            fixes.append(Fix("learner GPUs", need, why, relation=">="))
            return plan, stages
    steps = [
        ("c", True, Fix("optim.gradient_checkpointing", "true")),
        ("d", False, Fix("diagnostics.predicted_entropy_change", "false", "its fp32 [tokens, vocab] pre-pass tensors")),
        ("ch", min(1024, chunk), Fix("optim.logits_chunk_tokens", min(1024, chunk))),
    ]
    if gpus > 1:
        steps.append(("stage", 3, Fix("optim.zero_stage", 3)))
    if snapshot:
        steps.append(("snap", False, Fix("system.weight_sync_publish_from", "host", _SNAPSHOT_FIX)))
    # the knobs the fixes turn (bools and ints), keyed like `steps`
    state: dict[str, Any] = {"c": ckpt, "d": diag, "ch": chunk, "stage": stage, "snap": True}
    default = dict(state)

    def state_fits(st: dict[str, Any], n: int = t) -> bool:
        return fits(items_for(st["stage"], st["c"], n, min(st["ch"], n), st["d"], st["snap"]))

    applied = []
    for key, value, fix in steps:
        if not state_fits(state) and state[key] != value:
            state[key] = value
            applied.append((key, fix))
    for key, fix in list(applied):
        trial = {**state, key: default[key]}
        if state_fits(trial):
            state = trial
            applied.remove((key, fix))
    fixes += [fix for _, fix in applied]
    if not state_fits(state):
        best = _largest_tokens(lambda n: state_fits(state, n), t)
        if best >= seq_tokens:
            rows_fit = best // seq_tokens
            fixes.append(
                Fix(
                    "optim.max_tokens_per_micro_batch",
                    best,
                    f"or optim.micro_batch={rows_fit} rows of {seq_tokens:,} tokens"
                    if tokens_field == "optim.micro_batch"
                    else "",
                )
            )
        else:
            fixes.append(
                Fix(
                    "rollout.max_new_tokens",
                    None,
                    f"one {seq_tokens:,}-token sequence does not fit next to "
                    "the model states: shorten it or the prompt (data.max_prompt_len), or shard more "
                    "(optim.zero_stage=3, more learner GPUs)",
                )
            )
    plan.fixes = fixes
    return plan, stages


_SNAPSHOT_FIX = "publish a pinned host copy instead of the model's copy on rank 0's GPU (slower NCCL sends)"


def _gpus_for_states(shape: ModelShape, dtype_bytes: int, room: int) -> int | None:
    """The fewest ZeRO-3 ranks whose model states per GPU fit in `room` bytes (None: not up to 4,096)."""
    for n in range(1, 4097):
        if (
            model_state_bytes(shape.params, shape.largest_layer_params, stage=3, gpus=n, dtype_bytes=dtype_bytes)[0]
            <= room
        ):
            return n
    return None


def _largest_tokens(fits: Callable[[int], bool], upper: int) -> int:
    """The largest n in [0, upper] with fits(n) (fits is monotone in n)."""
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo
