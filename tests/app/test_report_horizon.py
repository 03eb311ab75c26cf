"""The longer-horizon study's curves (stare.app.report.horizon) against hand-derived values."""

import json

import pytest

from stare.app.report.horizon import bands, crossing, eval_curve, paired_curve


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


def test_paired_differences_leave_out_a_seed_run_on_another_machine():
    a = {0: _rec([(100, 0.5)]), 1: _rec([(100, 0.9)], machine="other/AVX512")}
    b = {0: _rec([(100, 0.3)]), 1: _rec([(100, 0.1)])}
    assert paired_curve(a, b, "pass@1") == [(100, pytest.approx(0.2), pytest.approx(0.2), pytest.approx(0.2))]


def test_crossing_is_where_the_difference_turns_and_stays_non_negative():
    diffs = [
        (0, -0.1, -0.2, 0.0),
        (100, 0.05, -0.01, 0.1),
        (200, -0.01, -0.05, 0.02),
        (300, 0.02, 0.001, 0.04),
        (400, 0.03, -0.01, 0.06),
    ]
    assert crossing(diffs) == {"means": 300, "separated": 300}
    assert crossing(diffs[:3]) == {"means": None, "separated": None}  # negative at the last evaluation
    assert crossing([]) == {"means": None, "separated": None}


def test_the_report_gains_the_longer_horizon_section_and_its_figure(tmp_path):
    from stare.app.report.results import main

    def run(root, name, finals):
        d = root / name
        d.mkdir(parents=True)
        (d / "config.yaml").write_text("run:\n  steps: 4\n")
        metrics = [
            {
                "step": i + 1,
                "entropy": 0.2 + 0.01 * i,
                "band_low": 0.1,
                "band_high": 0.3,
                "target": 0.2,
                "w": 1.0,
                "gate": 1,
                "time_step_s": 1.0,
            }
            for i in range(4)
        ]
        evals = [
            {"step": s, "greedy_accuracy": 0.5, "avg_at_k": c / 8, "correct_counts": [[8, c]]}
            for s, c in zip((0, 2, 4), finals)
        ]
        (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
        (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
        return d

    runs = [run(tmp_path / "runs", "s0-stare", (1, 2, 4)), run(tmp_path / "runs", "s0-grpo", (2, 2, 3))]
    for r in runs:
        assert main(["--record", str(r), "--records", str(tmp_path / "records")]) == 0
        assert main(["--record", str(r), "--records", str(tmp_path / "long")]) == 0
    out, figure = tmp_path / "docs" / "results.md", tmp_path / "docs" / "images" / "horizon.png"
    assert (
        main(
            [
                "--records",
                str(tmp_path / "records"),
                "--long-records",
                str(tmp_path / "long"),
                "--out",
                str(out),
                "--figures",
                str(tmp_path / "docs" / "results"),
                "--long-figure",
                str(figure),
            ]
        )
        == 0
    )
    text = out.read_text()
    assert "## Longer horizon (4 steps)" in text and "evaluated every 2 steps" in text
    assert "![longer horizon](images/horizon.png)" in text and figure.stat().st_size > 0
    # stare - grpo pass@1 per step: (1-2)/8, 0, (4-3)/8; the mean turns non-negative at step 2
    assert "| 0 | 0.125 [0.125, 0.125] | 0.250 [0.250, 0.250] | -0.125 [-0.125, -0.125] |" in text
    assert "turns non-negative at step 2" in text and "first lies above zero at step 4" in text
