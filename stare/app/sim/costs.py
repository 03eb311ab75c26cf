"""The cost model of `stare sim`: how long each piece of GPU work takes, from roofline facts.

One module, every constant with its source. What it models:

* **decode** (memory-bound): one engine step reads the weights once plus every running sequence's KV
  cache, `(W + KV) / (HBM bandwidth x HBM_EFFICIENCY)` (split over the engine's tensor-parallel GPUs),
  plus a fixed per-step cost: with CUDA graphs `STEP_OVERHEAD_GRAPH_S` (scheduler, sampler); eager adds
  one dispatch per kernel, `layers x KERNELS_PER_LAYER x EAGER_LAUNCH_S`;
* **prefill and training** (compute-bound): FLOPs over peak x MFU. Training counts 6N per token
  (forward + backward) + 2N for the recompute under gradient checkpointing + 2N for the learner's
  no-grad pre-pass, plus attention's context-length term;
* **transfers** over the link the placement uses (NVLink between GPUs, PCIe to host, pageable host
  copies), **disk** for checkpoints.

Not modelled: preemption when the KV cache overflows (admission keeps it within the cache), MoE,
pipeline parallelism, NCCL over sockets between containers (issue #24 item 4), network between nodes.
Response lengths: `LengthModel` (a truncated lognormal, documented in docs/performance.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stare.plan.sizes import ModelShape

GB = 1e9


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator's roofline numbers (dense bf16, no sparsity)."""

    name: str
    bf16_flops: float  # FLOP/s
    hbm_bytes_s: float  # B/s
    mem_gib: float
    gpu_link_bytes_s: float  # GPU <-> GPU, per direction (NVLink; PCIe where there is none)
    host_link_bytes_s: float  # GPU <-> host, per direction (PCIe)
    source: str


# PCIe per direction: Gen5 x16 ~64 GB/s, Gen4 x16 ~32 GB/s (PCI-SIG: 32 / 16 GT/s per lane x 16 lanes,
# 128b/130b encoding; shared/DESIGN.md section 5 for Gen5).
PCIE5_BYTES_S = 64 * GB
PCIE4_BYTES_S = 32 * GB

GPUS: dict[str, GpuSpec] = {
    "h100-80gb": GpuSpec(
        "h100-80gb",
        989e12,
        3.35e12,
        80,
        450 * GB,
        PCIE5_BYTES_S,
        "NVIDIA H100 SXM5 datasheet: 989 TFLOP/s bf16 dense, 3.35 TB/s, NVLink 900 GB/s bidirectional "
        "(shared/DESIGN.md section 5)",
    ),
    "h200": GpuSpec(
        "h200",
        788e12,
        4.3e12,
        141,
        450 * GB,
        PCIE5_BYTES_S,
        "measured on the lent H200 (shared/DESIGN.md section 5): 788 TFLOP/s on an 8k bf16 matmul, "
        "~4.3 TB/s device copy (datasheet: 989 TFLOP/s, 4.8 TB/s); NVLink as the H100's",
    ),
    "a100-80gb": GpuSpec(
        "a100-80gb",
        312e12,
        2.0e12,
        80,
        300 * GB,
        PCIE4_BYTES_S,
        "NVIDIA A100 80GB SXM datasheet: 312 TFLOP/s bf16 dense, 2.0 TB/s (2,039 GB/s), NVLink 600 GB/s bidirectional",
    ),
    "l40s": GpuSpec(
        "l40s",
        362e12,
        864e9,
        48,
        PCIE4_BYTES_S,
        PCIE4_BYTES_S,
        "NVIDIA L40S datasheet: 362 TFLOP/s bf16 dense (733 with sparsity), 864 GB/s GDDR6, 48 GB, "
        "PCIe Gen4 x16, no NVLink (GPU to GPU over PCIe)",
    ),
}

# --- efficiencies and overheads (one set for every run; never tuned per run) --------------------
# Fraction of peak HBM bandwidth decode reaches: the lent H200 copies at 4.3 of 4.8 TB/s (0.9,
# DESIGN.md section 5); GEMV and paged-attention kernels run below a plain copy: 0.8.
HBM_EFFICIENCY = 0.8
# Training MFU: prime-rl publishes 14-35% for its trainer (Qwen3-4B, 8 x H100, DESIGN.md section 5);
# we take the top of that range for a ZeRO-3 / FSDP trainer with packed, token-budgeted micro-batches.
MFU_TRAIN = 0.35
# Prefill MFU: large GEMMs over many prompt tokens run closer to peak than training; 0.5.
MFU_PREFILL = 0.5
# Eager decoding: every kernel of every layer is a separate launch from Python. PyTorch's eager
# dispatch + CUDA launch costs ~10 us per op on the host (the CUDA Graphs post on NVIDIA's
# developer blog, "Getting Started with CUDA Graphs": launch overheads of microseconds per kernel,
# more with framework dispatch); a decoder layer is ~12 kernels (2 norms, QKV, rope, attention,
# O-proj, 2 residual adds, gate-up, activation, down, plus KV write). CUDA graphs replay the step as
# one launch: the term vanishes.
EAGER_LAUNCH_S = 10e-6
KERNELS_PER_LAYER = 12
# What an engine step costs besides the model (scheduling, sampling with log-probs, output
# processing) with CUDA graphs: ~2 ms (an assumption of the order vLLM's V1 scheduler reports; not
# measured here).
STEP_OVERHEAD_GRAPH_S = 2e-3
# Collectives over NVLink reach ~70% of the link (NCCL all-gather bus bandwidth vs link rate).
LINK_EFFICIENCY = 0.7
# Pageable host memory: a cudaMemcpy from/to pageable memory stages through a pinned buffer and
# runs at about half the pinned rate (NVIDIA developer blog, "How to Optimize Data Transfers in
# CUDA C/C++").
PAGEABLE_FRACTION = 0.5
# Per-tensor cost of today's host-path publish (a ZeRO-3 gather per parameter, a synchronising copy
# to host, and the broadcast's per-message header read): ~1 ms per tensor (an assumption).
PER_TENSOR_HOST_S = 1e-3
# Node-local checkpoint writes: a datacenter NVMe Gen4 drive writes ~4 GB/s sequentially; torch.save
# serialisation and the file system halve that: 2 GB/s (an assumption, stated in docs/performance.md).
DISK_BYTES_S = 2 * GB
# vLLM's own memory besides weights and KV cache (activations, CUDA graphs, sampler): 2 GiB.
ENGINE_RESERVE_BYTES = 2 * 2**30
BF16 = 2  # bytes per weight / KV element


@dataclass(frozen=True)
class ModelCosts:
    """Shape-derived sizes of one decoder-only model (bf16 weights and KV)."""

    shape: ModelShape

    @property
    def weight_bytes(self) -> float:
        return self.shape.params * BF16

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer: 2 x layers x kv_heads x head_dim x 2 bytes (Qwen2.5-7B: 57,344)."""
        s = self.shape
        return 2 * s.layers * s.kv_dim * BF16

    @property
    def head_bytes(self) -> float:
        return self.shape.vocab * self.shape.hidden * BF16

    @property
    def tensors(self) -> int:
        """Parameter tensors of a llama/qwen2 decoder (9 per layer with biases, embeddings, norm, head)."""
        return 12 * self.shape.layers + 3

    def attention_flops_per_token(self, context: float) -> float:
        """Forward attention FLOPs of one token attending to `context` tokens: QK^T and AV,
        2 x 2 x context x heads x head_dim per layer."""
        s = self.shape
        return 4 * s.layers * s.heads * s.head_dim * context


@dataclass(frozen=True)
class NodeCosts:
    """Times of the GPU work of one run on one kind of GPU (the stand-ins' clock)."""

    gpu: GpuSpec
    model: ModelCosts
    tp: int = 1  # tensor-parallel GPUs per rollout engine
    eager: bool = True

    # ------------------------------------------------------------------ rollout
    def step_overhead_s(self) -> float:
        graph = STEP_OVERHEAD_GRAPH_S
        return graph + (self.model.shape.layers * KERNELS_PER_LAYER * EAGER_LAUNCH_S if self.eager else 0.0)

    def decode_span_s(self, steps: int, seqs: int, context_sum: float) -> float:
        """`steps` engine steps of `seqs` sequences whose contexts sum to `context_sum` at the first
        step and grow by one token each per step: sum over j of (W + kv x (context_sum + seqs x j))
        / bandwidth, + the per-step overhead."""
        if steps <= 0:
            return 0.0
        bw = self.gpu.hbm_bytes_s * HBM_EFFICIENCY * self.tp
        kv_tokens = steps * context_sum + seqs * steps * (steps - 1) / 2
        return (
            steps * self.model.weight_bytes + self.model.kv_bytes_per_token * kv_tokens
        ) / bw + steps * self.step_overhead_s()

    def prefill_s(self, tokens: float) -> float:
        """Prompt tokens prefilled (a group's samples share them: prefix caching): 2N FLOPs each."""
        flops = tokens * 2 * self.model.shape.params
        return flops / (self.gpu.bf16_flops * self.tp * MFU_PREFILL)

    def kv_capacity_tokens(self, memory_utilization: float) -> float:
        """Tokens the engine's KV cache holds: its memory share less weights and reserve."""
        free = self.gpu.mem_gib * 2**30 * memory_utilization * self.tp - self.model.weight_bytes - ENGINE_RESERVE_BYTES
        return max(free, 0.0) / self.model.kv_bytes_per_token

    # ------------------------------------------------------------------ learner
    def train_flops(
        self, tokens: float, mean_len: float, *, recompute: bool, prepass: bool = True, extra_forward: int = 0
    ) -> float:
        """FLOPs of one optimizer step over `tokens` (prompt + response) of sequences averaging
        `mean_len`: 6N (+2N recompute, +2N pre-pass, +2N per extra forward) per token, plus attention
        (causal: mean context len/2; forward 1x, backward 2x, recompute and pre-pass 1x each)."""
        n = self.model.shape.params
        passes = 6 + 2 * recompute + 2 * prepass + 2 * extra_forward
        attn_passes = 3 + recompute + prepass + extra_forward
        return tokens * (passes * n + attn_passes * self.model.attention_flops_per_token(mean_len / 2))

    def prepass_s(self, tokens: float, mean_len: float, gpus: int, *, zero3: bool, head_gathers: int = 0) -> float:
        """The learner's no-grad pre-pass over `tokens` alone (ahead of a step: optim.prepass_early): 2N per
        token plus attention's forward, at MFU_TRAIN, and `head_gathers` output-head all-gathers under ZeRO-3."""
        flops = tokens * (2 * self.model.shape.params + self.model.attention_flops_per_token(mean_len / 2))
        gather = head_gathers * self.allgather_s(self.model.head_bytes, gpus) if zero3 else 0.0
        return flops / (gpus * self.gpu.bf16_flops * MFU_TRAIN) + gather

    def train_s(
        self,
        tokens: float,
        mean_len: float,
        gpus: int,
        *,
        recompute: bool,
        zero3: bool,
        head_gathers: int = 0,
        extra_forward: int = 0,
    ) -> float:
        """One optimizer step on `gpus` learner GPUs: compute at MFU_TRAIN, plus `head_gathers`
        all-gathers of the output head under ZeRO-3 (issue #24 item 5: serial, not prefetched)."""
        compute = self.train_flops(tokens, mean_len, recompute=recompute, extra_forward=extra_forward) / (
            gpus * self.gpu.bf16_flops * MFU_TRAIN
        )
        gather = head_gathers * self.allgather_s(self.model.head_bytes, gpus) if zero3 else 0.0
        return compute + gather

    def allgather_s(self, nbytes: float, gpus: int) -> float:
        if gpus <= 1:
            return 0.0
        return nbytes * (gpus - 1) / gpus / (self.gpu.gpu_link_bytes_s * LINK_EFFICIENCY)

    # ------------------------------------------------------------------ weights and disk
    def publish_host_s(self, learner_gpus: int, zero3: bool) -> float:
        """Today's path: gather, copy every tensor to pageable host memory, and back to the GPU for
        NCCL (learner/engine/deepspeed_engine.py, weight_sync/buckets.py), one tensor at a time."""
        gather = self.allgather_s(self.model.weight_bytes, learner_gpus) if zero3 else 0.0
        return gather + 2 * self.pageable_copy_s() + self.model.tensors * PER_TENSOR_HOST_S

    def pageable_copy_s(self) -> float:
        """The weights copied once between the GPU and pageable host memory."""
        return self.model.weight_bytes / (self.gpu.host_link_bytes_s * PAGEABLE_FRACTION)

    def publish_device_s(self, learner_gpus: int, zero3: bool) -> float:
        """The new path: gather on the GPU into device buffers, no host round trip."""
        return self.allgather_s(self.model.weight_bytes, learner_gpus) if zero3 else 0.0

    def broadcast_s(self) -> float:
        """NCCL broadcast of the weights from the learner to the rollout GPUs (a ring: each link
        carries the weights once, so the time does not grow with the receivers)."""
        return self.model.weight_bytes / (self.gpu.gpu_link_bytes_s * LINK_EFFICIENCY)

    def refit_colocated_s(self) -> float:
        """Colocated: the engine takes the trainer's weights on the same GPU (CUDA IPC): a device copy."""
        return 2 * self.model.weight_bytes / (self.gpu.hbm_bytes_s * HBM_EFFICIENCY)

    def sleep_wake_s(self) -> float:
        """Colocated: the engine's weights to pinned host memory and back (vLLM sleep level 1), once
        each way per step over PCIe; the KV cache is discarded, not copied."""
        return 2 * self.model.weight_bytes / self.gpu.host_link_bytes_s

    def checkpoint_bytes(self) -> float:
        """A ZeRO checkpoint: bf16 module weights (2N) + fp32 master weights and two Adam moments (12N)."""
        return 14 * self.model.shape.params

    def checkpoint_s(self) -> float:
        return self.checkpoint_bytes() / DISK_BYTES_S


@dataclass(frozen=True)
class LengthModel:
    """Response lengths: a lognormal with the given mean and log-space sigma, truncated at `cap`
    (a capped sample is a "length" finish). Long-tailed like RL rollouts: the longest of a batch
    is several times the mean."""

    mean: float
    sigma: float
    cap: int

    def sample(self, rng, n: int):
        import numpy as np

        mu = math.log(self.mean) - self.sigma**2 / 2
        x = rng.lognormal(mu, self.sigma, n)
        return np.clip(np.rint(x), 1, self.cap).astype(int)


def fit_lognormal(lengths) -> tuple[float, float]:
    """(mean, sigma) of a lognormal fitted to observed lengths by moments of their logs."""
    import numpy as np

    logs = np.log(np.maximum(np.asarray(lengths, dtype=float), 1.0))
    sigma = float(logs.std())
    return float(math.exp(logs.mean() + sigma**2 / 2)), sigma
