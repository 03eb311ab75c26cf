"""Memory plan of a run: what each role needs per GPU, whether it fits, and which field to change.

    stare plan --config C [--gpus N] [--gpu-mem-gib G]      (the learner also checks itself at start)

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
    diagnostics    diagnostics.predicted_entropy_change: the pre-pass upcasts the response logits to fp32
                   and takes their log-softmax, [T_response, V] each: 8 T_response V.
    weight send    NCCL weight sync (rank 0, beside the next step when it publishes in the background):
                   two system.weight_sync_bucket_mb buckets; published from the host, also the two
                   messages in flight, each up to a whole large tensor copied to the GPU: 2 bucket
                   + 2 b largest layer (from the device large tensors are sent from their own memory).
    weight snapshot published from the device (system.weight_sync_publish_from), rank 0: under ZeRO-3
                   the gathered copy of the whole model, b P; published in the background
                   (max_staleness >= 1) a copy being sent and the next one: 2 b P.

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

A role fits when its total is at most HEADROOM x GPU memory (the rest: CUDA context, NCCL buffers,
allocator fragmentation). These are estimates of the large terms, good to a few GiB, not a promise;
`scripts/gpu_smoke.sh` measures the real peak.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from stare.config import ConfigError, TrainConfig
from stare.plan.sizes import (
    CHUNK_TENSORS,
    DTYPE_BYTES,
    ModelShape,
    activation_bytes,
    kv_bytes_per_token,
    load_model_shape,
    lora_params,
    model_state_bytes,
)
from stare.plan.weights import (
    _publish_from,
    checkpoint_disk,
    weight_receive_bytes,
    weight_send_bytes,
    weight_snapshot_bytes,
)
from stare.weight_sync.factory import receive_buffer_sets

GIB = 1 << 30
HEADROOM = 0.9  # fraction of a GPU's memory a role may plan to use
DEFAULT_PROMPT_TOKENS = 1024  # when neither data.max_prompt_len nor --prompt-tokens says
VLLM_PROFILE_TOKENS = 8192  # tokens of the forward pass vLLM profiles (its batched-token budget)
RECEIVE_RESERVE = 1 * GIB  # beside vLLM's share: the rollout process's CUDA context and NCCL's buffers


# --- plans ----------------------------------------------------------------------------------


@dataclass
class Item:
    name: str
    bytes: int
    note: str = ""


@dataclass(frozen=True)
class Fix:
    """One change that helps a role fit: `field` (a config field, or "learner GPUs") to `value`."""

    field: str
    value: Any = None  # None: no single value (the text says what)
    why: str = ""
    relation: str = "="  # "=", ">=" or "<="

    def __str__(self) -> str:
        head = (
            self.field
            if self.value is None
            else f"{self.field}{f' {self.relation} ' if self.relation != '=' else '='}{self.value}"
        )
        return f"{head} ({self.why})" if self.why else head

    @property
    def override(self) -> str | None:
        """The `--set` override for this fix, when it is one config field set to one value."""
        return (
            f"{self.field}={self.value}"
            if self.value is not None and self.relation == "=" and " " not in self.field
            else None
        )


@dataclass
class RolePlan:
    role: str  # learner | rollout
    gpus: int
    gpu_mem_bytes: int
    items: list[Item]
    fits: bool
    fixes: list[Fix] = field(default_factory=list)  # what to change
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    usable_bytes: int | None = None  # what the role may plan to use; None: HEADROOM x GPU memory
    title: str = ""  # the heading `stare plan` prints (empty: from the role)

    @property
    def total(self) -> int:
        return sum(i.bytes for i in self.items)

    @property
    def usable(self) -> int:
        return int(HEADROOM * self.gpu_mem_bytes) if self.usable_bytes is None else self.usable_bytes


@dataclass
class Plan:
    config: str
    model: ModelShape
    dtype: str
    seq_tokens: int
    prompt_tokens: int
    prompt_source: str
    roles: list[RolePlan]
    zero_stages: dict[int, dict[str, Any]]  # learner model states per stage
    checkpoint: dict[str, Any] = field(default_factory=dict)  # checkpoint_disk()
    how: list[str] = field(
        default_factory=list
    )  # one GPU, colocated: what sleeps and moves when (stare.plan.colocation)

    @property
    def fits(self) -> bool:
        return all(r.fits for r in self.roles)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for role, plan in zip(out["roles"], self.roles):
            role.update(
                total_bytes=plan.total,
                usable_bytes=plan.usable,
                fixes=[{**asdict(f), "text": str(f)} for f in plan.fixes],
            )
        out["fits"] = self.fits
        return out


def _prompt_tokens(cfg: TrainConfig, shape: ModelShape, prompt_tokens: int | None) -> tuple[int, str]:
    if prompt_tokens is not None:
        return prompt_tokens, "--prompt-tokens"
    configured = getattr(cfg.data, "max_prompt_len", None)
    if configured is not None:
        return int(configured), "data.max_prompt_len"
    room = max(shape.max_positions - cfg.rollout.max_new_tokens, 1)
    return min(DEFAULT_PROMPT_TOKENS, room), "assumed: set data.max_prompt_len or pass --prompt-tokens"


def plan_learner(
    cfg: TrainConfig,
    shape: ModelShape,
    *,
    gpus: int,
    gpu_mem_bytes: int,
    seq_tokens: int,
    beside: tuple[Item, ...] = (),
) -> tuple[RolePlan, dict]:
    """`beside`: what else holds memory on the learner's GPU while it steps (a sleeping engine)."""
    o = cfg.optim
    b = DTYPE_BYTES[cfg.model.dtype]
    stages = {}
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
    fits = lambda items: sum(i.bytes for i in items) <= usable  # noqa: E731
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
    state = {"c": ckpt, "d": diag, "ch": chunk, "stage": stage, "snap": True}
    default = dict(state)
    state_fits = lambda st, n=t: fits(items_for(st["stage"], st["c"], n, min(st["ch"], n), st["d"], st["snap"]))  # noqa: E731
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


def build_plan(
    cfg: TrainConfig,
    *,
    gpus: int,
    gpu_mem_gib: float,
    shape: ModelShape | None = None,
    prompt_tokens: int | None = None,
    roles: tuple[str, ...] = ("learner", "rollout"),
    config_name: str = "",
) -> Plan:
    """The memory plan of `cfg` with the learner on `gpus` GPUs and each rollout worker on one, of
    `gpu_mem_gib` GiB each (one GPU shared by both, `stare train` colocated: stare.plan.colocation)."""
    if gpus < 1:
        raise ConfigError(f"--gpus must be >= 1, got {gpus}")
    if gpu_mem_gib <= 0:
        raise ConfigError(f"--gpu-mem-gib must be > 0, got {gpu_mem_gib}")
    shape = shape or load_model_shape(cfg)
    prompt, source = _prompt_tokens(cfg, shape, prompt_tokens)
    seq = prompt + cfg.rollout.max_new_tokens
    mem = int(gpu_mem_gib * GIB)
    out, stages = [], {}
    if "learner" in roles:
        learner, stages = plan_learner(cfg, shape, gpus=gpus, gpu_mem_bytes=mem, seq_tokens=seq)
        out.append(learner)
    if "rollout" in roles:
        out.append(plan_rollout(cfg, shape, gpu_mem_bytes=mem, seq_tokens=seq))
    return _whole_plan(cfg, shape, prompt, source, out, stages, config_name)


def _whole_plan(
    cfg: TrainConfig,
    shape: ModelShape,
    prompt: int,
    source: str,
    roles: list[RolePlan],
    stages: dict,
    config_name: str,
    how: list[str] = (),
) -> Plan:
    seq = prompt + cfg.rollout.max_new_tokens
    if seq > shape.max_positions:
        for r in roles:
            r.notes.append(f"prompt + response = {seq:,} tokens exceeds the model's {shape.max_positions:,} positions")
    return Plan(
        config=config_name,
        model=shape,
        dtype=cfg.model.dtype,
        seq_tokens=seq,
        prompt_tokens=prompt,
        prompt_source=source,
        roles=roles,
        zero_stages=stages,
        checkpoint=checkpoint_disk(cfg, shape),
        how=list(how),
    )
