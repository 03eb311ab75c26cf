"""The longer-horizon study (stare.app.report.horizon, long_study) against hand-derived values."""

import json

import pytest

from stare.app.report.claims import step_diffs
from stare.app.report.horizon import bands, eval_curve


def _rec(points, machine="m/AVX2"):
    return {"machine": machine, "eval_curve": [{"step": s, "pass@1": v} for s, v in points]}


def test_a_curve_has_one_point_per_evaluation_with_counts_and_unbiased_pass_at_k():
    evals = [
        {"step": 0, "greedy_accuracy": 0.5, "correct_counts": [[8, 2], [8, 0]]},
        {"step": 50, "greedy_accuracy": 0.6},  # no per-problem counts: no point
        {"step": 100, "greedy_accuracy": 0.7, "correct_counts": [[64, 1]]},
    ]
    curve = eval_curve(evals)
    assert [p["step"] for p in curve] == [0, 100]
    assert curve[0] == {"step": 0, "greedy": 0.5, "pass@1": 0.125, "pass@8": 0.5, "pass@64": None}
    assert curve[1]["pass@1"] == pytest.approx(1 / 64, abs=1e-6) and curve[1]["pass@64"] == 1.0
    assert curve[1]["pass@8"] == pytest.approx(8 / 64, abs=1e-6)  # one correct of 64: k/n


def test_bands_average_seeds_at_the_steps_every_seed_reached():
    seeds = {0: _rec([(0, 0.2), (100, 0.4), (200, 0.5)]), 1: _rec([(0, 0.4), (100, 0.6)])}  # seed 1 still running
    rows = bands(seeds, "pass@1")
    assert [r[0] for r in rows] == [0, 100]
    assert rows[0][1] == pytest.approx(0.3) and rows[1][1] == pytest.approx(0.5)
    assert rows[0][2] >= 0.2 - 1e-12 and rows[0][3] <= 0.4 + 1e-12


def test_per_step_differences_leave_out_a_seed_run_on_another_machine():
    a = {0: _rec([(100, 0.5)]), 1: _rec([(100, 0.9)], machine="other/AVX512")}
    b = {0: _rec([(100, 0.3)]), 1: _rec([(100, 0.1)])}
    assert step_diffs({"a": a, "b": b}, "a", "b", "pass@1") == {100: [pytest.approx(0.2)]}


START = [[64, 1]] * 4  # step 0, every run: pass@1 1/64, pass@64 1 (each problem has a correct sample)
STEP2 = {"stare": [[64, 2]] * 4, "grpo": [[64, 4]] * 4}
FINAL = {  # step 4, per label and seed: pass@64 is the share of problems with a correct sample
    ("stare", 0): [[64, 10], [64, 10], [64, 10], [64, 0]],  # pass@1 30/256, pass@64 3/4
    ("stare", 1): [[64, 12], [64, 10], [64, 10], [64, 0]],  # pass@1 32/256, pass@64 3/4
    ("stare", 2): [[64, 12], [64, 10], [64, 10], [64, 0]],  # no grpo seed 2 yet: not paired
    ("grpo", 0): [[64, 20], [64, 20], [64, 0], [64, 0]],  # pass@1 40/256, pass@64 2/4
    ("grpo", 1): [[64, 20], [64, 20], [64, 0], [64, 0]],
}


def _long_run(root, label, seed):
    d = root / f"s{seed}-{label}"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text("run:\n  steps: 4\n")
    metrics = [{"step": i + 1, "entropy": 0.2 + 0.01 * i, "w": 1.0, "time_step_s": 1.0} for i in range(4)]
    greedy = {"stare": 0.6, "grpo": 0.5}[label]
    evals = [
        {"step": 0, "greedy_accuracy": 0.5, "correct_counts": START},
        {"step": 2, "greedy_accuracy": 0.5, "correct_counts": STEP2[label]},
        {"step": 4, "greedy_accuracy": greedy, "avg_at_k": 0.1, "correct_counts": FINAL[(label, seed)]},
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    return d


def test_the_longer_horizon_section_pairs_what_completed_and_says_what_the_data_shows(tmp_path):
    from stare.app.report.results import main

    for label, seed in FINAL:
        run = _long_run(tmp_path / "runs", label, seed)
        assert main(["--record", str(run), "--records", str(tmp_path / "long2")]) == 0
        if seed == 0:
            assert main(["--record", str(run), "--records", str(tmp_path / "records")]) == 0
    out, figure = tmp_path / "docs" / "results.md", tmp_path / "docs" / "images" / "horizon.png"
    none = str(tmp_path / "none")
    args = ["--records", str(tmp_path / "records"), "--long-records", str(tmp_path / "long2"), "--out", str(out)]
    args += ["--figures", str(tmp_path / "docs" / "results"), "--long-figure", str(figure)]
    args += ["--first-long-records", none, "--mb-records", none, "--smollm2-records", none]
    assert main(args) == 0
    text = out.read_text()
    assert "## Longer horizon (4 steps)" in text and figure.stat().st_size > 0
    assert "Seeds completed: stare 3 (0,1,2); grpo 2 (0,1) (planned: 10 of each)." in text
    assert "| stare - grpo (2 seeds) |" in text  # seed 2 of stare has no grpo run to pair with
    # step 2: pass@1 (2 - 4)/64 for both seeds, no spread; step 4: pass@1 -10/256 and -8/256, mean
    # -0.0351563, sd 0.0055243, half width t_{0.975,1} 0.0055243 / sqrt(2) = 12.7062 x 0.0039063 = 0.0496;
    # pass@64 3/4 - 2/4 for both seeds; greedy 0.6 - 0.5
    assert "| step (stare - grpo, 2 seeds) | greedy | pass@1 | pass@64 |" in text
    assert "| 2 | +0.000 [+0.000, +0.000] | -0.031 [-0.031, -0.031] * | +0.000 [+0.000, +0.000] |" in text
    assert "| 4 | +0.100 [+0.100, +0.100] * | -0.035 [-0.085, +0.014] | +0.250 [+0.250, +0.250] * |" in text
    # end - start of pass@64: stare -1/4 (3 seeds), grpo -2/4 (2 seeds); stare - grpo +1/4 with no spread:
    # paired t p 0 (holds under the t-test), sign-flip p 2/4 with 2 seeds
    assert (
        "Coverage against the starting model: stare, grpo end below the starting model's pass@64 (the t-interval "
        "of end minus start lies below 0). STARE ends with more pass@64 than GRPO (+0.250 [+0.250, +0.250], "
        "holds (t-test)): it loses less coverage than GRPO; it adds none."
    ) in text
    assert "(stare and dapo share no completed seed on one machine fingerprint yet)" in text
    assert (
        "| C8 | 1,500 steps (Longer horizon) | stare - grpo | pass@64 | 2 | +0.250 [+0.250, +0.250] | 0.5000 /" in text
    )
    assert "| C10 | 1,500 steps (Longer horizon) | stare - dapo | pass@1 | 0 | no records |" in text
