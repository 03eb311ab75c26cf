"""Shared pieces of the `stare sim` tests: model shapes and the tiny simulated node."""

from __future__ import annotations

from pathlib import Path

from stare.plan.sizes import ModelShape

# Qwen2.5-Math-7B (configs/models/qwen2.5-math-7b.json; params counted by stare plan)
QWEN7B = ModelShape(
    params=7_615_616_512,
    largest_layer_params=0,
    hidden=3584,
    layers=28,
    heads=28,
    kv_heads=4,
    head_dim=128,
    intermediate=18944,
    vocab=152064,
    max_positions=4096,
    source="test",
)

TINY = ModelShape(
    params=10_000_000,
    largest_layer_params=0,
    hidden=256,
    layers=4,
    heads=4,
    kv_heads=2,
    head_dim=64,
    intermediate=512,
    vocab=1000,
    max_positions=512,
    source="test",
)

TINY_OVERRIDES = [
    "rollout.prompts_per_step=16",
    "system.rollout_batch_prompts=16",
    "rollout.samples_per_prompt=8",
    "rollout.max_new_tokens=40",
    "data.dynamic_sampling=false",
    "system.max_staleness=0",
    "run.checkpoint_every=1000",
    "task.eval_every=1000",
    "sim.response_mean=30",
    "sim.response_sigma=0",
    "sim.prompt_tokens=1",
]


def tiny(overrides=()):
    """The bundled tiny config with the tiny node's settings (+ `overrides`): (config, sim settings)."""
    from stare.app.sim.design import split_overrides
    from stare.config import load_config

    passed, sim = split_overrides(None, [*TINY_OVERRIDES, *overrides])
    return load_config(Path("configs/tiny-cpu.yaml"), overrides=passed), sim


def simulate_tiny(overrides=(), *, gpus=2, learner_gpus=1, steps=3, warmup=1, shape=TINY, gpu="h100-80gb"):
    """The tiny node simulated: (run, summary, costs)."""
    from stare.app.sim.design import build_design, gpu_costs, lengths_of, simulate

    cfg, sim = tiny(overrides)
    design = build_design(cfg, sim, gpus=gpus, learner_gpus=learner_gpus, colocated=False)
    costs = gpu_costs(cfg, sim, design, shape, gpu)
    run, summary = simulate(cfg, sim, design, costs, lengths_of(cfg, sim), steps=steps, warmup=warmup)
    return run, summary, costs
