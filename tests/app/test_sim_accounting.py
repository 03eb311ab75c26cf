"""`stare sim`'s accounting: what a measured window is charged, and that large steps simulate."""

from __future__ import annotations

import pytest
from sim_helpers import simulate_tiny


def test_a_checkpoint_inside_the_window_is_charged_once():
    """On-policy, a checkpoint every 2 steps: step 2's write falls inside the measured window (steps 2..4).
    The window is charged each step's share of one write (checkpoint_s / 2) and not the write itself on top:
    the same run with no checkpoint in reach, plus checkpoint_s / 2 - checkpoint_s / 10^6 a step."""
    _, every2, costs = simulate_tiny(["run.checkpoint_every=2"], steps=3, warmup=1)
    _, never, _ = simulate_tiny(["run.checkpoint_every=1000000"], steps=3, warmup=1)
    share = costs.checkpoint_s / 2 - costs.checkpoint_s / 1_000_000
    assert every2["s_per_step"] == pytest.approx(never["s_per_step"] + share, rel=1e-9)
    assert every2["critical_path_s_per_step"]["checkpoint"] == pytest.approx(costs.checkpoint_s / 2, rel=1e-12)


def test_a_step_of_more_samples_than_one_collector_pull_simulates():
    """520 prompts x 8 samples in one blocking batch: 4,160 scored entries become visible at once, more than
    the 4,096 the collector pulls per call; the sim goes on pulling instead of stopping."""
    run, summary, _ = simulate_tiny(
        ["rollout.prompts_per_step=520", "system.rollout_batch_prompts=520"], steps=1, warmup=0
    )
    assert summary["tokens_per_step"] == 4160 * 31
    assert all(m["groups"] == 520 for m in run.metrics)


def test_an_evaluation_every_2_steps_is_charged_half_an_evaluation_a_step():
    """The learner waits for an evaluation every task.eval_every steps: each step carries that share of one
    evaluation's span, in s/step and on the critical path."""
    _, every2, costs = simulate_tiny(["task.eval_every=2"], steps=3, warmup=1)
    _, rare, _ = simulate_tiny([], steps=3, warmup=1)  # task.eval_every=1000
    assert costs.eval_s > 0
    assert every2["s_per_step"] == pytest.approx(rare["s_per_step"] + costs.eval_s * (1 / 2 - 1 / 1000), rel=1e-9)
    assert every2["critical_path_s_per_step"]["evaluation"] == pytest.approx(costs.eval_s / 2, rel=1e-12)


def test_the_7b_recipe_evaluates_60_problems_of_33_samples():
    """configs/paper: 30 + 30 AIME problems, a greedy sample and 32 sampled (eval_sources n 32) each."""
    from pathlib import Path

    from stare.app.sim.evaluation import evaluation_samples
    from stare.config import load_config

    cfg = load_config(Path("configs/paper/short-cot-qwen2.5-math-7b-stare.yaml"))
    assert evaluation_samples(cfg) == (60, 33)
    assert cfg.task.eval_every == 10


def test_a_colocated_node_evaluates_on_every_ranks_engine_after_a_wake_and_the_zero3_gather():
    """The product's EVALUATE op (stare/app/colocation/node_evaluation.py): the held-out problems split over
    the 4 ranks' engines, as 4 separate rollout engines sample them, plus each engine's sleep/wake and the
    ZeRO-3 gather of the weights on every rank; shorter than one engine sampling them all."""
    from sim_helpers import TINY, tiny

    from stare.app.sim.design import build_design, gpu_costs, lengths_of
    from stare.app.sim.evaluation import evaluation_s

    cfg, sim = tiny(["task.eval_every=10", "task.eval_problems=64", "optim.zero_stage=3"])
    lengths = lengths_of(cfg, sim)
    node = build_design(cfg, sim, gpus=4, learner_gpus=None, colocated=True)
    costs = gpu_costs(cfg, sim, node, TINY, "h100-80gb")
    nc = costs.engine

    def span(design) -> float:
        return evaluation_s(cfg, design, costs, lengths, prompt_len=1, factor=1.0)

    apart = build_design(cfg, sim, gpus=5, learner_gpus=1, colocated=False)  # 4 rollout engines
    gather = nc.allgather_s(nc.model.weight_bytes, 4)
    assert costs.swap_s > 0 and gather > 0
    assert span(node) == pytest.approx(span(apart) + costs.swap_s + gather, rel=1e-12)
    one = build_design(cfg, sim, gpus=5, learner_gpus=4, colocated=False)  # one engine for all 64 problems
    assert span(one) > span(apart)
