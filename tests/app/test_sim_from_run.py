"""`stare sim --from-run RUN`: a run's measured step pieces beside the model's, read from a real `stare up` run."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from stare.app.sim import from_run


def test_solve_rates_are_fitted_to_the_filtered_fraction():
    # Beta(1, 1): a group of n is all-equal with probability E[p^n + (1-p)^n] = 2 / (n + 1)
    assert from_run.solve_beta_for(2 / 9, 8) == pytest.approx(1.0, rel=1e-6)
    assert from_run.solve_beta_for(0.5, 8) < 1.0 < from_run.solve_beta_for(0.1, 8)  # more filtered: U-shaped


def test_measured_pieces_are_medians_after_the_first_step():
    metrics = [
        {"time_step_s": 9.0, "time_learn_s": 5.0, "time_plan_s": 1.0, "time_wait_data_s": 3.0, "time_publish_s": 0.1},
        {"time_step_s": 2.0, "time_learn_s": 1.0, "time_plan_s": 0.5, "time_wait_data_s": 0.4, "time_publish_s": 0.1},
        {"time_step_s": 4.0, "time_learn_s": 2.0, "time_plan_s": 0.5, "time_wait_data_s": 1.0, "time_publish_s": 0.3},
        {"time_step_s": 3.0, "time_learn_s": 1.5, "time_plan_s": 0.5, "time_wait_data_s": 0.6, "time_publish_s": 0.2},
    ]
    assert from_run.measured(metrics) == {
        "step": 3.0,
        "learner train": 2.0,
        "wait for data": 0.6,
        "weight publish": 0.2,
    }


def _args(*argv):
    from stare.app.sim import command

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    return parser.parse_args(["sim", *argv])


def test_a_folder_without_metrics_exits_2_naming_the_file(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("{}\n")
    args = _args("--from-run", str(tmp_path), "--gpu", "cpu", "--profile", str(tmp_path / "p.json"))
    assert args.fn(args) == 2
    assert "no metrics.jsonl there" in capsys.readouterr().err


PROFILE = {  # a CPU profile's fields (stare sim --calibrate writes them): seconds, tokens
    "decode_a_s": 0.002,
    "decode_b_s": 0.0005,
    "length_mean": 18.0,
    "length_sigma": 0.4,
    "learn_s": 0.8,
    "other_s": 0.1,
    "publish_s": 0.05,
    "weights_in_s": 0.05,
    "reward_s_per_traj": 0.001,
    "prompt_mean": 12.0,
}


@pytest.mark.slow
def test_from_run_reads_a_stare_up_run_and_prints_both_sides(tmp_path, capsys):
    """A 4-step `stare up` on this machine (the tiny config); then --from-run on a CPU profile prints every
    piece measured and modelled, the biggest disagreement and a knob."""
    from stare.app.bench.bench_overlap import run_arm

    run_arm(0, 4, 1, 1, tmp_path / "runs", [])
    run = tmp_path / "runs" / "overlap-s0"
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(PROFILE))
    args = _args(
        "--from-run",
        str(run),
        "--gpu",
        "cpu",
        "--profile",
        str(profile),
        "--gpus",
        "2",
        "--steps",
        "2",
        "--warmup",
        "1",
    )
    assert args.fn(args) == 0
    out = capsys.readouterr().out
    for label in ("step", "learner train", "wait for data", "weight publish"):
        assert label in out
    step = sorted(m["time_step_s"] for m in metrics[1:])[len(metrics[1:]) // 2]
    assert f"{step:>10.3f}" in out  # the measured median as read from the run
    assert "biggest disagreement:" in out and "the knob the model says helps most:" in out
    assert math.isfinite(step)
