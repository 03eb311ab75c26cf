"""The mini-batch and SmolLM2 studies of docs/results.md (stare.app.report.results / studies) against
hand-derived values."""

import json

import pytest

from stare.app.report.results import update_numbers
from stare.app.report.studies import entropy_bands, entropy_table


def test_update_numbers_average_the_logged_step_metrics_and_take_each_batch_last_update():
    metrics = [
        {
            "updates": 2,
            "clip_fraction_low": 0.0,
            "clip_fraction_high": 0.1,
            "approx_kl": 0.002,
            "ratio_std": 0.01,
            "cov_selected_tokens": 2.0,
            "per_update": {"0": {"approx_kl": 0.0}, "1": {"approx_kl": 0.004}},
        },
        {
            "updates": 2,
            "clip_fraction_low": 0.02,
            "clip_fraction_high": 0.3,
            "approx_kl": 0.004,
            "ratio_std": 0.03,
            "cov_selected_tokens": 4.0,
            "per_update": {"1": {"approx_kl": 0.006}, "0": {"approx_kl": 0.002}},
        },
    ]
    n = update_numbers(metrics)
    assert n["updates"] == 2.0
    assert n["clip_low"] == pytest.approx(0.01) and n["clip_high"] == pytest.approx(0.2)
    assert n["approx_kl"] == pytest.approx(0.003) and n["ratio_std"] == pytest.approx(0.02)
    assert n["approx_kl_last_update"] == pytest.approx(0.005)  # update "1" of each step: (0.004 + 0.006) / 2
    assert n["cov_selected"] == 3.0


def test_update_numbers_of_one_update_per_batch_and_of_a_run_that_logged_none():
    one = update_numbers([{"updates": 1, "approx_kl": 0.0, "ratio_std": 0.0}])
    assert (one["approx_kl_last_update"], one["updates"], one["cov_selected"]) == (0.0, 1.0, None)
    assert set(update_numbers([{"entropy": 0.2}]).values()) == {None}  # a record made before mini-batches


def _rec(entropies, machine="m/AVX2"):
    return {"machine": machine, "entropy_curve": [list(range(1, len(entropies) + 1)), list(entropies)]}


def test_entropy_bands_smooth_over_a_trailing_window_at_the_steps_every_seed_reached():
    seeds = {0: _rec([0.4, 0.2, 0.3]), 1: _rec([0.6, 0.4])}  # seed 1 reached step 2
    rows = entropy_bands(seeds, window=2)
    assert [r[0] for r in rows] == [2]  # a 2-step window first ends at step 2; step 3: seed 0 only
    assert rows[0][1] == pytest.approx((0.3 + 0.5) / 2)  # seed means (0.4+0.2)/2 and (0.6+0.4)/2


def test_entropy_table_pairs_seeds_on_one_machine_only():
    data = {
        "stare": {0: _rec([0.5, 0.4]), 1: _rec([0.9, 0.9], machine="other/AVX512")},
        "grpo": {0: _rec([0.3, 0.1]), 1: _rec([0.1, 0.1])},
    }
    lines = entropy_table(data, "stare", "grpo", [2])
    assert "paired (1 seed, 95% t)" in lines[0]
    assert lines[2].endswith("| +0.300 |")  # seed 0: 0.4 - 0.1; one seed, no interval


def _run(root, name, *, entropy, updates=1, kl=0.0):
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text("run:\n  steps: 4\n")
    metrics = [
        {
            "step": i + 1,
            "entropy": entropy,
            "band_low": 0.1,
            "band_high": 0.3,
            "target": 0.2,
            "w": 1.0,
            "gate": 0,
            "time_step_s": 1.0,
            "updates": updates,
            "approx_kl": kl,
            "clip_fraction_low": 0.0,
            "clip_fraction_high": 0.5 * kl,
            "ratio_std": 10 * kl,
        }
        for i in range(4)
    ]
    evals = [{"step": s, "greedy_accuracy": 0.5, "avg_at_k": 0.5, "correct_counts": [[4, 2]]} for s in (0, 2, 4)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    return d


def test_the_report_gains_the_mini_batch_and_smollm2_sections_and_their_figures(tmp_path):
    from stare.app.report.results import main

    records = {
        "records": [],
        "mb": [("s0-grpo", 0.2, 1, 0.0), ("s0-kl-cov-mb", 0.3, 8, 0.002)],
        "smollm2": [("s0-stare", 0.5, 1, 0.0), ("s0-grpo", 0.4, 1, 0.0)],
    }
    for folder, runs in records.items():
        for name, h, u, kl in runs or [("s0-grpo", 0.2, 1, 0.0)]:
            run = _run(tmp_path / "runs" / folder, name, entropy=h, updates=u, kl=kl)
            assert main(["--record", str(run), "--records", str(tmp_path / folder)]) == 0
    out, images = tmp_path / "docs" / "results.md", tmp_path / "docs" / "images"
    assert (
        main(
            [
                "--records",
                str(tmp_path / "records"),
                "--long-records",
                str(tmp_path / "none"),
                "--out",
                str(out),
                "--figures",
                str(tmp_path / "docs" / "results"),
                "--mb-records",
                str(tmp_path / "mb"),
                "--mb-figure",
                str(images / "minibatch.png"),
                "--smollm2-records",
                str(tmp_path / "smollm2"),
                "--smollm2-figure",
                str(images / "smollm2.png"),
            ]
        )
        == 0
    )
    text = out.read_text()
    assert "## Several updates per batch" in text and "![several updates per batch](images/minibatch.png)" in text
    assert "| kl-cov-mb | 1 (0) | 8.0 [8.0, 8.0] | 0.00 [0.00, 0.00] | 0.10 [0.10, 0.10] |" in text  # 0.5 x 0.002
    assert "| approx_kl (x 1000) | +2.000 | n/a |" in text  # kl-cov-mb - grpo: (0.002 - 0) x 1e3, one seed
    assert "## A real model: SmolLM2-135M-Instruct (4 steps)" in text and "evaluations at steps 0, 2, 4" in text
    assert "| 4 | 0.500 [0.500, 0.500] | 0.400 [0.400, 0.400] | +0.100 |" in text
    assert (images / "minibatch.png").stat().st_size > 0 and (images / "smollm2.png").stat().st_size > 0
