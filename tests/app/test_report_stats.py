"""The statistics of docs/results.md against hand-derived values and independent computations."""

import itertools
import math

import numpy as np
import pytest

from stare.app.report.stats import bootstrap_ci, pass_at_k, pass_at_k_curve


def test_pass_at_k_matches_the_hand_derived_binomial_ratio():
    # n = 4, c = 1: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2; pass@4 = 1
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 4) == 1.0
    # n = 5, c = 2, k = 2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(64, 0, 64) == 0.0 and pass_at_k(64, 64, 1) == 1.0


def test_pass_at_k_equals_math_comb_up_to_64_samples():
    for n, c, k in [(64, 3, 8), (64, 10, 64), (64, 1, 1), (64, 32, 16), (64, 60, 5)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12, abs=1e-15)


def test_pass_at_1_is_the_fraction_correct_and_the_curve_averages_problems():
    counts = [[8, 2], [8, 0], [8, 8]]
    curve = pass_at_k_curve(counts, [1, 8, 16])
    assert curve[0] == pytest.approx((2 / 8 + 0 + 1) / 3)
    assert curve[1] == pytest.approx((1 + 0 + 1) / 3)  # k = n: any correct sample
    assert curve[2] is None  # k above n is not estimable


def test_pass_at_k_refuses_k_above_n():
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 5)


def test_bootstrap_of_equal_values_has_zero_width_and_of_one_value_too():
    assert bootstrap_ci([0.3, 0.3, 0.3]) == pytest.approx((0.3, 0.3, 0.3))
    assert bootstrap_ci([0.7]) == (0.7, 0.7, 0.7)
    assert bootstrap_ci([]) is None


def test_bootstrap_interval_matches_exact_enumeration_of_resamples():
    values = [0.0, 1.0, 2.0, 4.0]
    # every one of the 4^4 equally likely resamples, enumerated: the exact bootstrap distribution
    means = np.array([np.mean(r) for r in itertools.product(values, repeat=len(values))])
    low, high = np.quantile(means, [0.025, 0.975], method="inverted_cdf")
    mean, b_low, b_high = bootstrap_ci(values, resamples=50_000)
    assert mean == pytest.approx(1.75)
    assert (b_low, b_high) == (low, high)  # the Monte Carlo quantiles land on the exact atoms


def test_bootstrap_is_reproducible_and_contains_the_mean():
    values = [0.41, 0.45, 0.39, 0.5, 0.43]
    a, b = bootstrap_ci(values), bootstrap_ci(values)
    assert a == b
    assert a[1] <= a[0] <= a[2] and min(values) <= a[1] and a[2] <= max(values)


def _run(root, name, *, steps=4, last_eval_step=4, w=(1.0, 3.0, 2.0, 2.0), counts=((8, 2), (8, 0))):
    import json

    d = root / name
    d.mkdir()
    (d / "config.yaml").write_text(f"run:\n  steps: {steps}\n")
    metrics = [
        {
            "step": i + 1,
            "algo": "stare",
            "entropy": 0.2,
            "band_low": 0.1,
            "band_high": 0.3,
            "target": 0.2,
            "w": w[i],
            "gate": 1,
            "time_step_s": 1.5,
        }
        for i in range(steps)
    ]
    evals = [
        {"step": 0, "greedy_accuracy": 0.3, "correct_counts": [[4, 1]]},
        {
            "step": last_eval_step,
            "greedy_accuracy": 0.5,
            "avg_at_k": 0.125,
            "correct_counts": [list(c) for c in counts],
        },
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    return d


def test_results_take_completed_runs_only_and_compute_their_numbers_by_hand(tmp_path):
    from stare.app.report.results import collect, main

    _run(tmp_path, "s0-stare")
    _run(tmp_path, "s1-stare", last_eval_step=2)  # still running: its last evaluation is not the final one
    assert main(["--record", str(tmp_path / "s0-stare"), "--records", str(tmp_path / "records")]) == 0
    with pytest.raises(SystemExit, match="not a completed run"):
        main(["--record", str(tmp_path / "s1-stare"), "--records", str(tmp_path / "records")])
    data = collect(tmp_path / "records")
    assert list(data) == ["stare"] and list(data["stare"]) == [0]
    n = data["stare"][0]
    assert n["w_variation"] == pytest.approx((2 + 1 + 0) / 3)  # |3-1|, |2-3|, |2-2|
    assert n["pass@1"] == pytest.approx((2 / 8 + 0) / 2)
    assert n["pass@8"] == pytest.approx((1 + 0) / 2)
    assert n["pass@64"] is None  # 8 samples cannot estimate pass@64
    assert (n["greedy_first"], n["greedy_last"], n["in_band"], n["step_s"]) == (0.3, 0.5, 1.0, 1.5)


def test_differences_pair_seeds_only_on_the_same_machine_fingerprint(tmp_path):
    from stare.app.report.results import paired, record

    a, b = record(_run(tmp_path, "s0-stare")), record(_run(tmp_path, "s0-grpo", counts=((8, 0), (8, 0))))
    a2, b2 = record(_run(tmp_path, "s1-stare")), dict(record(_run(tmp_path, "s1-grpo")), machine="other/AVX2")
    lines = paired({"stare": {0: a, 1: a2}, "grpo": {0: b, 1: b2}}, "stare", "grpo", ["pass@1"])
    assert "(1 seed; seeds 1 left out: run on different machines)" in lines[0]
    # seed 0 only: (2/8 + 0)/2 - 0; one difference has no interval and no test
    assert (
        lines[2]
        == "| pass@1 | +0.125 | n/a | n/a | 1.0000 | n/a / 1.0000 | [+0.125, +0.125] | n/a | one seed: not resolved |"
    )


def test_docs_results_is_what_the_committed_records_give():
    """docs/results.md is regenerated from the records under docs/results/ (scripts/results.sh report):
    a record added or a report change without regenerating fails here."""
    from pathlib import Path

    from stare.app.report.long_study import FIRST_PROTOCOL_RECORDS, LONG_RECORDS
    from stare.app.report.results import MINI_BATCH_RECORDS, RECORDS_DIR, SMOLLM2_RECORDS, collect, render

    repo = Path(__file__).parents[2]
    data = collect(repo / RECORDS_DIR)
    long, first, mb, real = (
        collect(repo / d) if (repo / d).is_dir() else {}
        for d in (LONG_RECORDS, FIRST_PROTOCOL_RECORDS, MINI_BATCH_RECORDS, SMOLLM2_RECORDS)
    )
    notes = (repo / "docs" / "results-notes.md").read_text()
    text = render(
        data,
        "results",
        notes,
        long,
        "images/horizon.png",
        mb,
        "images/minibatch.png",
        real,
        "images/smollm2.png",
        first,
    )
    assert text == (repo / "docs" / "results.md").read_text(), "regenerate docs/results.md: scripts/results.sh report"
