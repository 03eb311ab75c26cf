"""`stare sim`: the simulated node against an independent sum of its pieces, the CLI at a tiny size, and the placement search on crafted cases."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from sim_helpers import TINY, tiny

from stare.app.sim.workload import fit_lognormal


def test_fit_lognormal_recovers_its_parameters():
    import numpy as np

    x = np.random.default_rng(0).lognormal(math.log(500) - 0.5**2 / 2, 0.5, 200_000)
    mean, sigma = fit_lognormal(x)
    assert mean == pytest.approx(500, rel=0.01)
    assert sigma == pytest.approx(0.5, rel=0.01)


class _T30:  # a trajectory of 1 prompt + 30 response tokens
    prompt_token_ids, response_token_ids = [1], [1] * 30


def _one_learner_one_engine(overrides=()):
    """The tiny node (1 learner + 1 engine, every response 30 tokens) simulated: (costs, summary, its NodeCosts)."""
    from stare.app.sim.design import build_design, gpu_costs, lengths_of, node_costs, simulate

    cfg, sim = tiny(list(overrides))
    design = build_design(cfg, sim, gpus=2, learner_gpus=1, colocated=False)
    costs = gpu_costs(cfg, sim, design, TINY, "h100-80gb")
    _, summary = simulate(cfg, sim, design, costs, lengths_of(cfg, sim), steps=3, warmup=1)
    return costs, summary, node_costs(cfg, sim, design, TINY, "h100-80gb")


def test_on_policy_step_is_the_sum_of_its_pieces():
    """One learner + one engine, on-policy, every response 30 tokens: a step is train + gather + the
    synchronous broadcast + prefill of 16 one-token prompts + 30 decode steps of 128 sequences (+ its
    share of a checkpoint every 1,000 steps), the reward workers scoring the 128 in between."""
    costs, summary, nc = _one_learner_one_engine()
    expected = (
        costs.train_s([_T30] * 128)
        + 128 * costs.reward_s_per_traj
        + costs.gather_s
        + max(costs.send_s, costs.recv_s)
        + nc.prefill_s(16)
        + nc.decode_span_s(30, 128, 128)
        + costs.checkpoint_s / 1000
        + costs.eval_s / 1000
    )  # a checkpoint's and an evaluation's share
    assert summary["s_per_step"] == pytest.approx(expected, rel=1e-6)
    assert summary["tokens_per_step"] == 128 * 31


@pytest.mark.parametrize("early", [True, False])
def test_the_pre_pass_of_groups_ready_early_leaves_the_step(early):
    """On-policy, two blocking batches of 8 prompts a step: the first batch's 64 trajectories are ready
    while the second decodes, so the learner pre-passes them then (optim.prepass_early) and the step's
    train time is the whole step's less their pre-pass; off, the step is the sum of its pieces."""
    costs, summary, nc = _one_learner_one_engine(
        ["system.rollout_batch_prompts=8", f"optim.prepass_early={str(early).lower()}", "sim.reward_s_per_traj=0"]
    )
    batch = nc.prefill_s(8) + nc.decode_span_s(30, 64, 64)
    # 64 x 31 tokens through 2N per token + attention's forward at a 15.5-token mean context, at the forward
    # efficiency (0.65 x 0.36 of 989 TFLOP/s)
    prepass = 64 * 31 * (2 * TINY.params + 4 * 4 * 4 * 64 * 15.5) / (989e12 * 0.65 * 0.36)
    assert (costs.prepass_s is not None) == early
    assert 0 < prepass < batch  # it fits inside the second batch
    if early:
        assert costs.prepass_s([_T30] * 64) == pytest.approx(prepass, rel=1e-12)
    ahead = prepass if early else 0.0
    expected = (
        2 * batch
        + costs.train_s([_T30] * 128)
        - ahead
        + costs.gather_s
        + max(costs.send_s, costs.recv_s)
        + costs.checkpoint_s / 1000
        + costs.eval_s / 1000
    )
    assert summary["s_per_step"] == pytest.approx(expected, rel=1e-6)


def test_overlap_hides_the_shorter_side():
    """max_staleness 1: rollout runs while the learner trains, so a step takes about the longer of
    the two sides, never their sum."""
    from stare.app.sim.design import build_design, gpu_costs, lengths_of, simulate

    out = {}
    for s in (0, 1):
        cfg, sim = tiny([f"system.max_staleness={s}", "sim.extra_forward=2000"])  # a slow learner
        design = build_design(cfg, sim, gpus=2, learner_gpus=1, colocated=False)
        costs = gpu_costs(cfg, sim, design, TINY, "h100-80gb")
        out[s] = simulate(cfg, sim, design, costs, lengths_of(cfg, sim), steps=4, warmup=2)[1]
    assert out[1]["s_per_step"] < out[0]["s_per_step"]
    assert out[1]["learner_busy_fraction"] > 0.95  # the learner, the slow side, never waits


def test_cli_writes_the_gantt_and_prints_the_fields(tmp_path, capsys):
    import argparse

    from stare.app.sim import command

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    args = parser.parse_args(
        [
            "sim",
            "--config",
            "configs/tiny-cpu.yaml",
            "--gpus",
            "2",
            "--learner-gpus",
            "1",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--gantt",
            str(tmp_path / "g.png"),
            "--set",
            "sim.response_mean=20",
            "--set",
            "sim.prompt_tokens=8",
        ]
    )
    assert args.fn(args) == 0
    text = capsys.readouterr().out
    for field in ("tokens/s/GPU", "s/step", "rollout decoding", "learner busy", "bottleneck", "busy per GPU"):
        assert field in text
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("case, best", [("decode-bound", 1), ("train-bound", 3)])
def test_placement_follows_the_bottleneck(case, best):
    """4 GPUs: long responses and a cheap learner want the most rollout GPUs; a learner with a
    hundredfold forward cost wants the most learner GPUs."""
    from stare.app.sim.placement import search

    extra = (
        ["sim.response_mean=38", "sim.extra_forward=0"]
        if case == "decode-bound"
        else ["sim.response_mean=5", "sim.extra_forward=200000"]
    )
    cfg, sim = tiny(["rollout.prompts_per_step=32", "system.rollout_batch_prompts=8", *extra])
    cands = search(cfg, sim, gpus=4, gpu="h100-80gb", shape=TINY, fits=lambda n: True, steps=2, warmup=1)
    assert cands[0].learner_gpus == best


def test_design_knobs_are_config_fields_and_sim_settings_have_defaults():
    from stare.app.sim.design import build_design, split_overrides
    from stare.config import load_config

    passed, sim = split_overrides(
        None,
        [
            "system.inflight_weight_updates=true",
            "system.rollout_streaming=true",
            "optim.lr=1e-5",
            "sim.response_mean=7",
        ],
    )
    assert passed == ["system.inflight_weight_updates=true", "system.rollout_streaming=true", "optim.lr=1e-5"]
    assert sim.knobs == {"sim.response_mean": 7}  # real fields go to the config, sim.* stay the sim's
    cfg = load_config(Path("configs/tiny-cpu.yaml"), overrides=passed)
    on = build_design(cfg, sim, gpus=2, learner_gpus=1, colocated=False)
    off = build_design(
        load_config(Path("configs/tiny-cpu.yaml")),
        split_overrides(None, [])[1],
        gpus=2,
        learner_gpus=1,
        colocated=False,
    )
    assert (on.streaming, off.streaming) == (True, False)  # None: off for the tiny config's hf engine
    assert (on.inflight, off.inflight) == (True, False)  # default off
    assert not on.eager  # the hf section has no enforce_eager: auto, and a simulated GPU has CUDA


def test_a_bad_design_value_exits_2_naming_the_field(capsys):
    import argparse

    from stare.app.sim import command

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["sim", "--config", "configs/tiny-cpu.yaml", "--set", "sim.zero3_head=per_token"])
    assert args.fn(args) == 2
    assert "sim.zero3_head='per_token': choose one of per_chunk, per_micro_batch" in capsys.readouterr().err


def test_an_oversampled_on_policy_round_is_one_round_of_whole_groups_and_its_surplus_is_counted():
    """Dynamic sampling on (2/9 of the groups filtered), 16 prompts a step: data.oversample 2 asks
    for 32 groups a round, so one round covers a step (>= 16 trainable of 32 all but surely); each
    step trains exactly 16 groups and the rest are counted, never trained. Without over-sampling the
    rounds ask for the missing groups only, more rounds a step, nothing surplus."""
    from stare.app.sim.design import build_design, gpu_costs, lengths_of, simulate

    out = {}
    for over in (1.0, 2.0):
        cfg, sim = tiny(
            [
                "data.dynamic_sampling=true",
                "data.max_sampling_rounds=10",
                f"data.oversample={over}",
                "sim.response_sigma=0.5",
            ]
        )
        design = build_design(cfg, sim, gpus=2, learner_gpus=1, colocated=False)
        costs = gpu_costs(cfg, sim, design, TINY, "h100-80gb")
        run, summary = simulate(cfg, sim, design, costs, lengths_of(cfg, sim), steps=4, warmup=1)
        assert all(m["groups"] == 16 for m in run.metrics)
        out[over] = (summary, run.metrics)
    one, two = out[1.0], out[2.0]
    assert all(m["sampling_rounds"] == 1 for m in two[1])
    assert one[0]["sampling_rounds_mean"] > 1 and one[0]["groups_surplus_total"] == 0
    # every round's trainable groups beyond the step's 16 are the surplus
    assert sum(m["surplus_groups"] for m in two[1]) == two[0]["groups_surplus_total"] > 0
    assert all(32 - m["filtered_groups"] - 16 == m["surplus_groups"] for m in two[1])


def test_the_placement_search_weighs_the_node_colocated_learner_as_the_product_runs_it():
    """With a gpu_memory_utilization for it, the colocated node is a candidate at each staleness and
    over-sampling factor, on every GPU, never with in-flight updates (the product refuses them); without one
    (its memory plan fits nowhere) it is not."""
    from stare.app.sim.placement import render, search

    cfg, sim = tiny(["rollout.engine=vllm", "rollout.prompts_per_step=32", "system.rollout_batch_prompts=8"])
    cands = search(cfg, sim, gpus=4, gpu="h100-80gb", shape=TINY, fits=lambda n: True, colocated_gmu=0.5, bands=False)
    coloc = [c for c in cands if c.colocated_gmu is not None]
    assert sorted((c.max_staleness, c.oversample) for c in coloc) == [(0, 1.0), (0, 1.5), (1, 1.0), (1, 1.2)]
    assert all(c.learner_gpus == 4 and not c.inflight and c.colocated_gmu == 0.5 for c in coloc)
    assert "coloc: the node-colocated learner on all 4 GPUs" in render(cands, 4, "h100-80gb")
    plain = search(cfg, sim, gpus=4, gpu="h100-80gb", shape=TINY, fits=lambda n: True, bands=False)
    assert all(c.colocated_gmu is None for c in plain) and len(plain) == len(cands) - 4


def test_the_colocated_candidate_takes_the_largest_gpu_memory_utilization_its_memory_plan_fits():
    """The 7B short-CoT recipe on 8 x 80 GiB: docs/deploy.md's memory plan fits at 0.49 and not at 0.5, so of
    the search's grid (0.95, 0.9, ..., 0.3) 0.45; an hf engine (no sleep mode to plan) gives no candidate."""
    from stare.app.sim.placement import colocated_gmu
    from stare.config import load_config
    from stare.plan.sizes import load_model_shape

    cfg = load_config(Path("configs/paper/short-cot-qwen2.5-math-7b-stare.yaml"))
    shape = load_model_shape(cfg, Path("configs/models/qwen2.5-math-7b.json"))
    assert colocated_gmu(cfg, gpus=8, gpu_mem_gib=80, shape=shape) == 0.45
    hf = load_config(Path("configs/paper/short-cot-qwen2.5-math-7b-stare.yaml"), overrides=["rollout.engine=hf"])
    assert colocated_gmu(hf, gpus=8, gpu_mem_gib=80, shape=shape) is None


def test_stare_plan_predicts_a_node_colocated_config_as_its_colocated_candidate():
    from stare.app.sim.placement import colocated_gmu, plan_text

    cfg, _ = tiny(["rollout.engine=vllm", "system.colocate=on"])
    text = plan_text(cfg, gpus=2, gpu="h100-80gb", gpu_mem_gib=80, shape=TINY)
    gmu = colocated_gmu(cfg, gpus=2, gpu_mem_gib=80, shape=TINY)
    assert gmu is not None
    assert text.startswith(
        f"predicted as configured (the node-colocated learner on 2 GPUs, modelled at gpu_memory_utilization {gmu:g}"
    )
    assert "  coloc: the node-colocated learner on all 2 GPUs" in text
