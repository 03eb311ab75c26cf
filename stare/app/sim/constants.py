"""Every constant of `stare sim`'s cost model, each with its source and a range.

A `Range` holds three values in the order that matters for a band: the **pessimistic** end (the one that
lowers modelled throughput), the **central** value, and the **optimistic** end. `constants(corner)` gives
one corner's values; `stare sim` and `stare plan --node-gpus` simulate the three corners (every constant
at its pessimistic end together, all central, all optimistic: joint corners, so the band is conservative
about independent errors) and print every figure as `central [low, high]`. docs/performance.md's table of
constants is generated from `TABLE` (`stare sim --constants`).

Sources are public: vLLM's blog and docs, SGLang's and vLLM's pull requests with measured tables,
torchtitan's, prime-rl's and verl's published benchmarks, NeMo-RL's published run (arithmetic in the
`source` text). "Assumption" marks a range no public measurement pins; its width says so.
"""

from __future__ import annotations

from dataclasses import dataclass

CORNERS = ("pessimistic", "central", "optimistic")
GIB = 2**30
VLLM_FP8_KV_BLOG = (
    "vLLM blog 'The State of FP8 KV-Cache and Attention Quantization in vLLM' (2026-04-22): Llama-3.1-8B on one "
    "H100, concurrency 1, ITL = 6.44 ms + 4.37e-5 ms x context tokens (B200: 3.93 ms + 1.80e-5)"
)


@dataclass(frozen=True)
class Range:
    """A constant's pessimistic / central / optimistic values (that order: throughput low to high)."""

    pessimistic: float
    central: float
    optimistic: float
    unit: str
    what: str
    source: str

    def at(self, corner: str) -> float:
        if corner not in CORNERS:
            raise ValueError(f"corner {corner!r}: choose one of {', '.join(CORNERS)}")
        return float(getattr(self, corner))


TABLE: dict[str, Range] = {
    # ------------------------------------------------------------------ decode (vLLM)
    "hbm_efficiency": Range(
        0.80,
        0.88,
        0.92,
        "of peak HBM",
        "decode's weight and KV reads",
        f"{VLLM_FP8_KV_BLOG}: the slope is Llama-3.1-8B's 131,072 KV bytes a token per 43.7 ns = 3.0 TB/s = 0.90 "
        "of 3.35 (B200: 0.91 of 8.0); pessimistic end: paged attention over many short blocks (assumption)",
    ),
    "decode_flop_efficiency": Range(
        0.45,
        0.60,
        0.75,
        "of peak bf16",
        "decode GEMMs when a step is compute-bound (large batches)",
        "assumption: GEMMs of a few hundred rows reach well below a large GEMM's efficiency",
    ),
    "step_overhead_s": Range(
        2.0e-3,
        1.2e-3,
        0.8e-3,
        "s a step",
        "an engine step's fixed cost with CUDA graphs (scheduler, sampler)",
        f"{VLLM_FP8_KV_BLOG}: the intercept less the weights read at 0.9 of peak leaves 1.1 ms (H100), 1.7 ms (B200)",
    ),
    "step_overhead_per_seq_s": Range(
        10e-6,
        4e-6,
        1e-6,
        "s a sequence a step",
        "sampling with log-probs and scheduling, per running sequence",
        "assumption (no published per-sequence figure; the batch-1 intercept above bounds the fixed part)",
    ),
    "kernel_launch_s": Range(
        6e-6,
        4e-6,
        2.5e-6,
        "s a kernel",
        "eager decoding: one host dispatch per kernel (12 a decoder layer)",
        "SGLang PR #1401 (sgl-project/sglang): Llama-3-8B batch-1 decode 7.06 ms with CUDA graphs, 9.28 ms "
        "without (triton), 7.35 / 8.23 ms (flashinfer): 0.9-2.2 ms over 32 layers = 2.3-5.7 us a kernel",
    ),
    "allreduce_latency_s": Range(
        10e-6,
        7e-6,
        4e-6,
        "s an all-reduce",
        "tensor-parallel decode: the fixed cost of each all-reduce",
        "SGLang PR #2904 (sgl-project/sglang), H100: 512-byte all-reduce at TP 2/4/8, vLLM's custom kernel "
        "9.5/9.1/10.1 us, SGLang's 3.7/4.8/5.9 us",
    ),
    "allreduce_bytes_s": Range(
        22e9,
        28e9,
        35e9,
        "B/s a GPU",
        "tensor-parallel all-reduce, bytes x (tp - 1) / tp at this rate",
        "SGLang PR #2904, H100, 1 MiB: vLLM's custom all-reduce 26.6/40.2/45.0 us at TP 2/4/8 = 25-30 GB/s "
        "after its latency; SGLang's kernel 19.9/31.1/33.8 us = 33 GB/s",
    ),
    "prefill_efficiency": Range(
        0.40,
        0.50,
        0.60,
        "of peak bf16",
        "prefill (prompt tokens, and the recompute of a preempted sequence)",
        "assumption: large GEMMs over many tokens, attention short at these prompt lengths",
    ),
    # ------------------------------------------------------------------ learner
    "train_efficiency_zero": Range(
        0.30,
        0.36,
        0.42,
        "MFU",
        "forward + backward (+ recompute) of a DeepSpeed ZeRO-3 / FSDP learner",
        "torchtitan benchmarks/llama3_h100_202412_torchtitan.md: Llama 3.1 8B, FSDP, 8 H100, 33% to 39% MFU "
        "(5,762-6,667 tokens/s/GPU); prime-rl benchmarks/results/BENCHMARKS.md: Qwen3-4B RL, FSDP, 8 H100, "
        "35.4% at 64k sequences",
    ),
    "train_efficiency_megatron": Range(
        0.48,
        0.55,
        0.62,
        "MFU",
        "forward + backward of a Megatron-core learner with sequence packing",
        "NeMo-RL v0.5 docs/about/performance-summary.md, Llama-3.1-8B one step off: 12N FLOPs a token (log-prob "
        "and reference forwards, forward + backward with recompute) x 2.57M tokens inside 64.8 s on 8 trainer "
        "H100 = 48% of peak with no idle time (the lower bound)",
    ),
    "forward_ratio_zero": Range(
        0.50,
        0.65,
        0.80,
        "x train efficiency",
        "a no-grad forward (the pre-pass, log-probs) per FLOP",
        "verl on H20 (volcengine/verl verl/experimental/fully_async_policy/README.md and docs/advance/"
        "one_step_off.md): old_log_prob (2N) vs update_actor (8N) of the same tokens, FSDP2: 0.47-0.81",
    ),
    "forward_ratio_megatron": Range(
        0.72,
        0.85,
        1.00,
        "x train efficiency",
        "a no-grad forward, Megatron-core",
        "verl docs/advance/one_step_off.md, Megatron: old_log_prob 119-120 s vs update_actor 344-347 s = 0.72",
    ),
    "zero3_overlap": Range(
        0.50,
        0.70,
        0.90,
        "hidden",
        "the share of ZeRO-3 parameter gathers and gradient reduce-scatters hidden behind compute (prefetch)",
        "assumption",
    ),
    "cpu_adam_s_per_param": Range(
        1.5e-9,
        0.8e-9,
        0.4e-9,
        "s a parameter",
        "an optimizer step on the CPU (system.colocate_offload)",
        "assumption (DeepSpeed's CPU Adam; the state crosses PCIe besides)",
    ),
    # ------------------------------------------------------------------ links, host, disk
    "link_efficiency": Range(
        0.60,
        0.70,
        0.80,
        "of the link",
        "NCCL collectives over NVLink / PCIe / the network",
        "assumption in the range of NCCL's bus bandwidth against the link rate",
    ),
    "pageable_fraction": Range(
        0.40,
        0.50,
        0.60,
        "of PCIe",
        "a copy from or to pageable host memory",
        "NVIDIA developer blog 'How to Optimize Data Transfers in CUDA C/C++': pageable copies stage through a "
        "pinned buffer at about half the pinned rate",
    ),
    "per_tensor_host_s": Range(
        2e-3,
        1e-3,
        0.3e-3,
        "s a tensor",
        "the host publish path: a gather, a synchronising copy per tensor",
        "assumption",
    ),
    "internode_bytes_s": Range(
        25e9,
        40e9,
        50e9,
        "B/s a GPU",
        "between nodes (a run over several nodes)",
        "400 Gb/s InfiniBand a GPU = 50 GB/s per direction, at 50-100% of it (assumption)",
    ),
    "disk_bytes_s": Range(
        1e9,
        2e9,
        4e9,
        "B/s",
        "checkpoint writes (torch.save of 14N bytes)",
        "assumption: a datacenter NVMe Gen4 drive writes ~4 GB/s; serialisation and the file system cost",
    ),
    "engine_reserve_bytes": Range(
        4 * GIB,
        2 * GIB,
        1 * GIB,
        "bytes",
        "vLLM's memory besides weights and KV (activations, graphs, sampler)",
        "assumption",
    ),
}
KERNELS_PER_LAYER = 12  # 2 norms, QKV, rope, attention, O-proj, 2 residual adds, gate-up, activation, down, KV write


@dataclass(frozen=True)
class Constants:
    """One corner's values of every `TABLE` entry (attribute names are the table's keys)."""

    corner: str
    hbm_efficiency: float
    decode_flop_efficiency: float
    step_overhead_s: float
    step_overhead_per_seq_s: float
    kernel_launch_s: float
    allreduce_latency_s: float
    allreduce_bytes_s: float
    prefill_efficiency: float
    train_efficiency_zero: float
    train_efficiency_megatron: float
    forward_ratio_zero: float
    forward_ratio_megatron: float
    zero3_overlap: float
    cpu_adam_s_per_param: float
    link_efficiency: float
    pageable_fraction: float
    per_tensor_host_s: float
    internode_bytes_s: float
    disk_bytes_s: float
    engine_reserve_bytes: float

    def train_efficiency(self, framework: str) -> float:
        return self.train_efficiency_megatron if framework == "megatron" else self.train_efficiency_zero

    def forward_efficiency(self, framework: str) -> float:
        ratio = self.forward_ratio_megatron if framework == "megatron" else self.forward_ratio_zero
        return ratio * self.train_efficiency(framework)


def constants(corner: str = "central", **override: float) -> Constants:
    """Every constant at `corner`; `override` replaces named values (a one-at-a-time sensitivity)."""
    unknown = set(override) - set(TABLE)
    if unknown:
        raise ValueError(f"unknown constant(s) {', '.join(sorted(unknown))}: choose from {', '.join(TABLE)}")
    values = {name: override.get(name, r.at(corner)) for name, r in TABLE.items()}
    return Constants(corner=corner, **values)


def markdown_table() -> str:
    """docs/performance.md's table of constants (`stare sim --constants`)."""
    rows = [
        "| constant | what | pessimistic | central | optimistic | unit | source |",
        "| --- | --- | ---: | ---: | ---: | --- | --- |",
    ]
    for name, r in TABLE.items():
        vals = " | ".join(_fmt(v) for v in (r.pessimistic, r.central, r.optimistic))
        rows.append(f"| `{name}` | {r.what} | {vals} | {r.unit} | {r.source} |")
    return "\n".join(rows)


def _fmt(v: float) -> str:
    if v >= GIB and float(v / GIB).is_integer():
        return f"{v / GIB:g} GiB"
    if v >= 1e9:
        return f"{v / 1e9:g}e9"
    if v < 1e-2:
        return f"{v:.2g}"
    return f"{v:g}"
