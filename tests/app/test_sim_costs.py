"""`stare sim`'s cost model against hand-derived numbers and against the public figures it is built on."""

from __future__ import annotations

import dataclasses

import pytest
from sim_helpers import QWEN7B

from stare.app.sim.constants import CORNERS, TABLE, Constants, constants
from stare.app.sim.costs import ModelCosts, NodeCosts
from stare.app.sim.gpus import GPUS, gpu
from stare.plan.sizes import ModelShape

# Llama-3.1-8B (configs/models/llama-3.1-8b.json): 8,030,261,248 parameters, KV 131,072 B a token
LLAMA8B = ModelShape(
    params=8_030_261_248,
    largest_layer_params=0,
    hidden=4096,
    layers=32,
    heads=32,
    kv_heads=8,
    head_dim=128,
    intermediate=14336,
    vocab=128256,
    max_positions=131072,
    source="test",
)
C = constants()
W7 = 2 * 7_615_616_512  # Qwen2.5-Math-7B bf16 weight bytes


def test_the_constants_table_and_its_corners_agree():
    assert [f.name for f in dataclasses.fields(Constants)] == ["corner", *TABLE]
    for name, r in TABLE.items():
        assert r.source and r.what and r.unit, name
        values = [constants(c).__getattribute__(name) for c in CORNERS]
        assert values == [r.pessimistic, r.central, r.optimistic]
    with pytest.raises(ValueError, match="unknown constant"):
        constants(hbm_eff=0.5)


def test_every_gpu_kind_is_its_datasheet_and_says_where_it_is_from():
    assert set(GPUS) == {"h100-80gb", "h200", "h800", "h20", "a100-80gb", "l40s", "b200"}
    h200 = gpu("h200")  # the datasheet's peaks, not a measured (already derated) figure
    assert (h200.bf16_flops, h200.hbm_bytes_s, h200.mem_gib) == (989e12, 4.8e12, 141)
    assert {k for k, g in GPUS.items() if not g.datasheet} == {"h20", "h800"}
    assert all(g.source for g in GPUS.values())
    with pytest.raises(ValueError, match="choose one of h100-80gb"):
        gpu("v100")


def test_every_gpu_kind_applies_the_hbm_efficiency_once():
    # one step of 1 sequence at context 0 with CUDA graphs: the weights over peak x 0.88, + 1.2 ms + 4 us
    for kind in GPUS:
        g = gpu(kind)
        nc = NodeCosts(g, ModelCosts(QWEN7B), C)
        expected = W7 / (g.hbm_bytes_s * 0.88) + 1.2e-3 + 4e-6
        flops = 2 * 7_615_616_512 / (g.bf16_flops * 0.6)
        assert nc.decode_span_s(1, 1, 0) == pytest.approx(max(expected, flops + 1.2e-3 + 4e-6), rel=1e-12), kind


@pytest.mark.parametrize("kind, intercept_ms, slope_ms", [("h100-80gb", 6.44, 4.37e-5), ("b200", 3.93, 1.80e-5)])
def test_batch_one_decode_brackets_vllms_published_fit(kind, intercept_ms, slope_ms):
    """vLLM's blog (FP8 KV cache, 2026-04-22): Llama-3.1-8B at concurrency 1, ITL = intercept + slope x context.
    The band holds the published ITL at contexts 1k-32k; the central value is within 12% of it."""
    for ctx in (1_000, 8_000, 32_000):
        published = (intercept_ms + slope_ms * ctx) * 1e-3
        at = {c: NodeCosts(gpu(kind), ModelCosts(LLAMA8B), constants(c)).decode_span_s(1, 1, ctx) for c in CORNERS}
        assert at["optimistic"] < published < at["pessimistic"], (kind, ctx, at, published)
        assert at["central"] == pytest.approx(published, rel=0.12), (kind, ctx)


def test_a_large_batch_step_is_compute_bound():
    # 4,096 sequences at context 0 on an H100: FLOPs 2 x N x 4,096 = 6.239e13 at 989e12 x 0.6 = 105.1 ms, more
    # than the 15.2 GB of weights at 2.948 TB/s (5.2 ms); + 1.2 ms + 4,096 x 4 us
    nc = NodeCosts(gpu("h100-80gb"), ModelCosts(QWEN7B), C)
    flops = 2 * 7_615_616_512 * 4096 / (989e12 * 0.6)
    assert nc.decode_span_s(1, 4096, 0) == pytest.approx(flops + 1.2e-3 + 4096 * 4e-6, rel=1e-12)


def test_a_decode_span_sums_its_steps():
    # 3 steps of 2 sequences at contexts summing to 30: KV tokens read 30 + 32 + 34 = 96 (memory-bound)
    nc = NodeCosts(gpu("a100-80gb"), ModelCosts(QWEN7B), C)
    bw = 2.039e12 * 0.88
    expected = (3 * W7 + 96 * 57_344) / bw + 3 * (1.2e-3 + 2 * 4e-6)
    assert nc.decode_span_s(3, 2, 30) == pytest.approx(expected, rel=1e-12)


def test_tensor_parallel_and_eager_add_their_per_step_costs():
    m = ModelCosts(QWEN7B)
    base = NodeCosts(gpu("h100-80gb"), m, C)
    # TP 2: half the weights and half of each token's KV (4 kv heads over 2 GPUs) a GPU, FLOPs over 2 GPUs,
    # and 2 all-reduces a layer of 64 x 3,584 x 2 bytes: 7 us + 458,752 x 1/2 / 28e9
    tp2 = NodeCosts(gpu("h100-80gb"), m, C, tp=2)
    bw = 3.35e12 * 0.88
    mem = (W7 / 2 + 28_672 * 64_000) / bw
    ar = 2 * 28 * (7e-6 + 64 * 3584 * 2 * 0.5 / 28e9)
    assert tp2.decode_span_s(1, 64, 64_000) == pytest.approx(mem + 1.2e-3 + 64 * 4e-6 + ar, rel=1e-12)
    assert m.kv_bytes_per_token_per_gpu(8) == 14_336  # fewer kv heads than GPUs: one head a GPU
    eager = NodeCosts(gpu("h100-80gb"), m, C, eager=True)
    assert eager.decode_span_s(1, 64, 64_000) - base.decode_span_s(1, 64, 64_000) == pytest.approx(28 * 12 * 4e-6)


def test_kv_capacity_of_a_tensor_parallel_engine():
    # TP 2 at 0.5 of 80 GiB: each GPU 40 GiB - 7.6 GB of weights - 2 GiB, over its 28,672 bytes a token
    nc = NodeCosts(gpu("h100-80gb"), ModelCosts(QWEN7B), C, tp=2)
    assert nc.kv_capacity_tokens(0.5) == pytest.approx((40 * 2**30 - W7 / 2 - 2 * 2**30) / 28_672)


def test_learner_phases_of_a_zero3_step():
    # 1,000 tokens (no attention context) on 2 H100s: train 8N at 0.36, pre-pass 2N at 0.65 x 0.36; ZeRO-3:
    # 3 micro-batches x (3 gathers + 1 reduce-scatter) + 3 pre-pass gathers of W x 1/2 at 450 GB/s x 0.7, 30%
    # exposed; optimizer: 28 bytes x N/2 at 3.35 TB/s x 0.88
    nc = NodeCosts(gpu("h100-80gb"), ModelCosts(QWEN7B), C)
    n = 7_615_616_512
    p = nc.learner_phases(1000, 0, 2, recompute=True, zero3=True, micro_batches=3, prepass_micro_batches=3)
    assert p["train"] == pytest.approx(8 * n * 1000 / (2 * 989e12 * 0.36))
    assert p["prepass"] == pytest.approx(2 * n * 1000 / (2 * 989e12 * 0.65 * 0.36))
    assert p["zero3"] == pytest.approx(0.3 * 15 * W7 / 2 / (450e9 * 0.7))
    assert p["optimizer"] == pytest.approx(28 * n / 2 / (3.35e12 * 0.88))
    megatron = NodeCosts(gpu("h100-80gb"), ModelCosts(QWEN7B), C, framework="megatron")
    assert megatron.learner_phases(1000, 0, 2, recompute=True, zero3=False, micro_batches=1)["train"] == (
        pytest.approx(8 * n * 1000 / (2 * 989e12 * 0.55))
    )


def test_a_learner_wider_than_a_node_gathers_over_the_network():
    nc = NodeCosts(gpu("h100-80gb"), ModelCosts(QWEN7B), C)
    assert nc.allgather_s(1e9, 16) == pytest.approx(1e9 * 15 / 16 / (40e9 * 0.7))
    assert nc.allgather_s(1e9, 8) == pytest.approx(1e9 * 7 / 8 / (450e9 * 0.7))


def test_corners_order_the_times():
    for kind in ("h100-80gb", "l40s"):
        t = {c: NodeCosts(gpu(kind), ModelCosts(QWEN7B), constants(c), tp=2, eager=True) for c in CORNERS}
        decode = [t[c].decode_span_s(50, 128, 128_000) for c in CORNERS]
        learn = [
            sum(t[c].learner_phases(1e6, 1000, 4, recompute=True, zero3=True, micro_batches=30).values())
            for c in CORNERS
        ]
        assert decode[0] > decode[1] > decode[2] and learn[0] > learn[1] > learn[2]
