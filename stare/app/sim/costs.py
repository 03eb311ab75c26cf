"""The cost model of `stare sim`: how long each piece of GPU work takes.

Every constant comes from stare/app/sim/constants.py (one corner of its ranges, with its source); the GPU's
peaks from stare/app/sim/gpus.py (datasheets, efficiencies applied here once).

* **decode**: an engine step of B sequences whose contexts sum to C reads its share of the weights and of
  their KV cache and computes 2N FLOPs a token plus attention over C; it takes the larger of
  bytes / (HBM x hbm_efficiency) and FLOPs / (peak x decode_flop_efficiency), plus a per-step cost:
  step_overhead_s + B x step_overhead_per_seq_s with CUDA graphs, one kernel dispatch per kernel more when
  eager, and with tensor parallelism two all-reduces of B x hidden x 2 bytes a layer (latency + bytes);
  a span of k steps between two events is priced in closed form (`decode_span_s`);
* **prefill** (compute-bound): 2N FLOPs a new prompt token at prefill_efficiency (a group's samples share
  their prompt: prefix caching); a preempted sequence's recompute is a prefill of its prompt and tokens;
* **the learner, per phase**: forward + backward (6N, + 2N recompute under gradient checkpointing, +
  attention) at the framework's train efficiency; the no-grad pre-pass and extra forwards (2N + attention)
  at its forward efficiency; ZeRO-3 parameter gathers and gradient reduce-scatters per micro-batch over the
  link, partly hidden (zero3_overlap); the optimizer state over PCIe when it is offloaded;
* **transfers** over the link the placement uses (NVLink, PCIe, pageable host copies, the network between
  nodes) and **disk** for checkpoints.

Not modelled: MoE, pipeline-parallel learners (a peer's pipeline bubble is the validation's business),
NCCL over sockets between containers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stare.app.sim.constants import KERNELS_PER_LAYER, Constants, constants
from stare.app.sim.gpus import GpuSpec
from stare.plan.sizes import ModelShape

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

    def kv_bytes_per_token_per_gpu(self, tp: int) -> float:
        """One tensor-parallel GPU's share: the KV heads split over tp (replicated when fewer than tp)."""
        s = self.shape
        heads_here = max(s.kv_heads / tp, 1.0)
        return 2 * s.layers * heads_here * s.head_dim * BF16

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
    """Times of the GPU work of one run on one kind of GPU at one corner of the constants."""

    gpu: GpuSpec
    model: ModelCosts
    k: Constants = field(default_factory=constants)
    tp: int = 1  # tensor-parallel GPUs per rollout engine
    eager: bool = False
    framework: str = "zero"  # the learner's: zero (DeepSpeed ZeRO / FSDP) or megatron (a peer's)
    gpus_per_node: int = 8  # a learner wider than this talks over the network between nodes

    # ------------------------------------------------------------------ rollout
    def step_fixed_s(self, seqs: int) -> float:
        """An engine step's cost besides the model's reads and FLOPs."""
        k, layers = self.k, self.model.shape.layers
        t = k.step_overhead_s + seqs * k.step_overhead_per_seq_s
        if self.eager:
            t += layers * KERNELS_PER_LAYER * k.kernel_launch_s
        if self.tp > 1:
            t += 2 * layers * self.allreduce_s(seqs * self.model.shape.hidden * BF16)
        return t

    def allreduce_s(self, nbytes: float) -> float:
        """One tensor-parallel all-reduce of `nbytes` among the engine's GPUs."""
        return self.k.allreduce_latency_s + nbytes * (self.tp - 1) / self.tp / self.k.allreduce_bytes_s

    def decode_span_s(self, steps: int, seqs: int, context_sum: float) -> float:
        """`steps` engine steps of `seqs` sequences whose contexts sum to `context_sum` at the first step and
        grow by one token each per step: the sum over the steps of max(bytes, FLOPs) time, + per-step costs."""
        if steps <= 0:
            return 0.0
        m, k = self.model, self.k
        bw = self.gpu.hbm_bytes_s * k.hbm_efficiency
        peak = self.gpu.bf16_flops * k.decode_flop_efficiency * self.tp
        kv = m.kv_bytes_per_token_per_gpu(self.tp)
        attn = m.attention_flops_per_token(1.0)  # per context token attended
        mem = ((m.weight_bytes / self.tp + kv * context_sum) / bw, kv * seqs / bw)  # (at step 0, growth a step)
        flop = ((2 * m.shape.params * seqs + attn * context_sum) / peak, attn * seqs / peak)
        return _sum_of_max(mem, flop, steps) + steps * self.step_fixed_s(seqs)

    def prefill_s(self, tokens: float) -> float:
        """Prompt tokens (or a preempted sequence's tokens) prefilled: 2N FLOPs each."""
        if tokens <= 0:
            return 0.0
        flops = tokens * 2 * self.model.shape.params
        t = flops / (self.gpu.bf16_flops * self.tp * self.k.prefill_efficiency)
        if self.tp > 1:
            t += 2 * self.model.shape.layers * self.allreduce_s(tokens * self.model.shape.hidden * BF16)
        return t

    def kv_capacity_tokens(self, memory_utilization: float) -> float:
        """Tokens an engine's KV cache holds: each GPU's memory share less its weights and vLLM's reserve,
        over its share of a token's KV."""
        m = self.model
        free = self.gpu.mem_gib * 2**30 * memory_utilization - m.weight_bytes / self.tp - self.k.engine_reserve_bytes
        return max(free, 0.0) / m.kv_bytes_per_token_per_gpu(self.tp)

    # ------------------------------------------------------------------ learner
    def train_flops(self, tokens: float, mean_len: float, *, recompute: bool) -> float:
        """Forward + backward (6N, + 2N recompute) FLOPs of `tokens` of sequences averaging `mean_len`, with
        attention (causal: mean context len/2; forward 1x, backward 2x, recompute 1x)."""
        n = self.model.shape.params
        attn = self.model.attention_flops_per_token(mean_len / 2)
        return tokens * ((6 + 2 * recompute) * n + (3 + recompute) * attn)

    def forward_flops(self, tokens: float, mean_len: float) -> float:
        """One no-grad forward (the pre-pass, a reference policy's log-probs): 2N + attention a token."""
        return tokens * (2 * self.model.shape.params + self.model.attention_flops_per_token(mean_len / 2))

    def learner_phases(
        self,
        tokens: float,
        mean_len: float,
        gpus: int,
        *,
        recompute: bool,
        zero3: bool,
        micro_batches: int,
        prepass: bool = True,
        prepass_micro_batches: int = 0,
        head_gathers: int = 0,
        extra_forward: int = 0,
        offload: bool = False,
    ) -> dict[str, float]:
        """One optimizer step on `gpus` learner GPUs, by phase (seconds): train, prepass, extra, zero3 (ZeRO-3's
        gathers, or a data-parallel learner's gradient sync), optimizer. `micro_batches` / `prepass_micro_batches`:
        each rank's (ZeRO-3 gathers per micro-batch)."""
        fw, k, peak = self.framework, self.k, self.gpu.bf16_flops * gpus
        out = {
            "train": self.train_flops(tokens, mean_len, recompute=recompute) / (peak * k.train_efficiency(fw)),
            "prepass": (self.forward_flops(tokens, mean_len) / (peak * k.forward_efficiency(fw))) if prepass else 0.0,
            "extra": extra_forward * self.forward_flops(tokens, mean_len) / (peak * k.forward_efficiency(fw)),
            "zero3": 0.0,
            "optimizer": self.optimizer_s(gpus, offload=offload),
        }
        if zero3 and gpus > 1:
            # training: parameters gathered for the forward, the backward and the recompute, gradients
            # reduce-scattered; a forward-only micro-batch gathers once; partly hidden behind compute
            per_train = (2 + recompute) + 1
            passes = micro_batches * per_train + (prepass_micro_batches if prepass else 0) * (1 + extra_forward)
            exposed = (1 - k.zero3_overlap) * passes * self.allgather_s(self.model.weight_bytes, gpus)
            out["zero3"] = exposed + head_gathers * self.allgather_s(self.model.head_bytes, gpus)
        elif gpus > 1:  # data parallel (ZeRO-1/2, a distributed optimizer): one gradient sync a step, partly hidden
            out["zero3"] = (1 - k.zero3_overlap) * 2 * self.allgather_s(self.model.weight_bytes, gpus)
        return out

    def prepass_s(self, tokens: float, mean_len: float, gpus: int, *, zero3: bool, micro_batches: int = 0) -> float:
        """The pre-pass alone (ahead of a step: optim.prepass_early), its ZeRO-3 gathers included."""
        t = self.forward_flops(tokens, mean_len) / (
            self.gpu.bf16_flops * gpus * self.k.forward_efficiency(self.framework)
        )
        if zero3 and gpus > 1:
            t += (1 - self.k.zero3_overlap) * micro_batches * self.allgather_s(self.model.weight_bytes, gpus)
        return t

    def optimizer_s(self, gpus: int, *, offload: bool = False) -> float:
        """Adam over this rank's share: bf16 params + fp32 master + 2 moments read and written (~28 bytes a
        parameter, memory-bound); offloaded: the 12N-byte state to the host and back over PCIe."""
        n = self.model.shape.params / gpus
        t = 28 * n / (self.gpu.hbm_bytes_s * self.k.hbm_efficiency)
        if offload:
            t += 2 * 12 * n / self.gpu.host_link_bytes_s
        return t

    def link_bytes_s(self, gpus: int) -> float:
        """A collective's rate among `gpus` learner GPUs: the GPU link within a node, the network across."""
        rate = (
            self.gpu.gpu_link_bytes_s
            if gpus <= self.gpus_per_node
            else min(self.gpu.gpu_link_bytes_s, self.k.internode_bytes_s)
        )
        return rate * self.k.link_efficiency

    def allgather_s(self, nbytes: float, gpus: int) -> float:
        if gpus <= 1:
            return 0.0
        return nbytes * (gpus - 1) / gpus / self.link_bytes_s(gpus)

    # ------------------------------------------------------------------ weights and disk
    def publish_host_s(self, learner_gpus: int, zero3: bool) -> float:
        """The host path: gather, copy every tensor to pageable host memory and back to the GPU for NCCL,
        one tensor at a time."""
        gather = self.allgather_s(self.model.weight_bytes, learner_gpus) if zero3 else 0.0
        return gather + 2 * self.pageable_copy_s() + self.model.tensors * self.k.per_tensor_host_s

    def pageable_copy_s(self) -> float:
        """The weights copied once between the GPU and pageable host memory."""
        return self.model.weight_bytes / (self.gpu.host_link_bytes_s * self.k.pageable_fraction)

    def publish_device_s(self, learner_gpus: int, zero3: bool) -> float:
        """The device path: gather on the GPU into device buffers, no host round trip."""
        return self.allgather_s(self.model.weight_bytes, learner_gpus) if zero3 else 0.0

    def broadcast_s(self, across_nodes: bool = False) -> float:
        """NCCL broadcast of the weights from the learner to the rollout GPUs (a ring: each link carries the
        weights once, so the time does not grow with the receivers)."""
        rate = (
            self.gpu.gpu_link_bytes_s if not across_nodes else min(self.gpu.gpu_link_bytes_s, self.k.internode_bytes_s)
        )
        return self.model.weight_bytes / (rate * self.k.link_efficiency)

    def refit_colocated_s(self) -> float:
        """Colocated: the engine takes the trainer's weights on the same GPU (CUDA IPC): a device copy."""
        return 2 * self.model.weight_bytes / (self.gpu.hbm_bytes_s * self.k.hbm_efficiency)

    def sleep_wake_s(self) -> float:
        """Colocated: the engine's weights to pinned host memory and back (vLLM sleep level 1), once each way
        per wake; the KV cache is discarded, not copied."""
        return 2 * self.model.weight_bytes / self.gpu.host_link_bytes_s

    def checkpoint_bytes(self) -> float:
        """A ZeRO checkpoint: bf16 module weights (2N) + fp32 master weights and two Adam moments (12N)."""
        return 14 * self.model.shape.params

    def checkpoint_s(self) -> float:
        return self.checkpoint_bytes() / self.k.disk_bytes_s


def _sum_of_max(a: tuple[float, float], b: tuple[float, float], k: int) -> float:
    """sum over j = 0..k-1 of max(a0 + a1 j, b0 + b1 j), in closed form (two lines cross at most once)."""

    def run(c0: float, c1: float, j0: int, j1: int) -> float:  # sum over j0 <= j < j1 of c0 + c1 j
        n = j1 - j0
        return n * c0 + c1 * (j0 + j1 - 1) * n / 2 if n > 0 else 0.0

    (a0, a1), (b0, b1) = a, b
    if a1 == b1:
        return run(max(a0, b0), a1, 0, k)
    cross = min(max(math.ceil((b0 - a0) / (a1 - b1)), 0), k)  # first j at which the steeper line leads
    steep, flat = (a, b) if a1 > b1 else (b, a)
    return run(flat[0], flat[1], 0, cross) + run(steep[0], steep[1], cross, k)
