"""Tests for stare/report.py: the per-run summary numbers (derived by hand), the files written, and
the comparison across algorithms and seeds."""

import json
import math
from pathlib import Path

import pytest

from stare.app.report import SUMMARY_KEYS, compare, ema, load_jsonl, summarize, write_comparison, write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _write_run(run_dir: Path, metrics: list[dict], evals: list[dict] | None = None) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    if evals is not None:
        (run_dir / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    return run_dir


# A STARE run with a logged band [0.25, 0.35]. Entropy enters the band at step 3; from there:
# 0.32 in, 0.35 in (bound inclusive), 0.50 out, 0.30 in, 0.20 out, 0.25 in (bound) -> 4/6.
BANDED_ENTROPY = [0.50, 0.40, 0.32, 0.35, 0.50, 0.30, 0.20, 0.25]


def _banded_run(tmp_path: Path) -> Path:
    metrics = [
        {
            "step": i + 1, "algo": "stare", "entropy": h, "target": 0.3, "band_low": 0.25, "band_high": 0.35,
            "gate": i >= 6,  # on for steps 7, 8 (logged as bools here; 0/1 works the same)
            "w": 1.0 + 0.05 * i, "m": 1.0 - 0.05 * i, "reward_mean": 0.1 * i, "accuracy": 0.1 * i,
            "response_length_mean": 100.0 + i, "tokens_per_s": 1000.0, "time_step_s": float(i + 1),
        }
        for i, h in enumerate(BANDED_ENTROPY)
    ]  # fmt: skip
    evals = [
        {"step": 0, "greedy_accuracy": 0.2, "pass_at_k": 0.5, "k": 4, "avg_at_k": 0.25},
        {"step": 4, "greedy_accuracy": 0.3, "pass_at_k": 0.6, "k": 4, "avg_at_k": 0.35},
        {"step": 8, "greedy_accuracy": 0.4, "pass_at_k": 0.7, "k": 4, "avg_at_k": 0.45, "per_level": {"1": 0.9}},
    ]
    return _write_run(tmp_path / "stare_s0", metrics, evals)


def _assert_png(path: Path) -> None:
    from matplotlib.image import imread

    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > 10_000, (path, len(data))  # a drawn figure, not an empty canvas
    assert imread(path).shape[0] > 100  # decodes completely


def test_ema_starts_at_first_value_and_halves_with_beta_half():
    # beta 0.5: 1; 0.5*1 + 0.5*0 = 0.5; 0.5*0.5 + 0.5*0 = 0.25; 0.5*0.25 + 0.5*1 = 0.625
    assert ema([1.0, 0.0, 0.0, 1.0], beta=0.5) == [1.0, 0.5, 0.25, 0.625]


def test_load_jsonl_skips_a_truncated_last_line(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1}\n\n{"step": 2}\n{"step": 3, "entr')
    assert load_jsonl(p) == [{"step": 1}, {"step": 2}]


def test_load_jsonl_skips_a_bad_line_before_the_last_and_keeps_the_rest(tmp_path, caplog):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1}\n{"step": \n{"step": 3}\n')
    assert load_jsonl(p) == [{"step": 1}, {"step": 3}]
    assert f"{p} line 2: not valid JSON" in caplog.text


def test_in_band_fraction_counts_from_first_entry_with_inclusive_bounds(tmp_path):
    s = summarize(_banded_run(tmp_path))
    assert s["band_source"] == "logged"
    assert s["first_in_band_step"] == 3
    assert s["in_band_fraction"] == pytest.approx(4 / 6, abs=1e-12)


def test_in_band_without_logged_band_uses_target_plus_minus_20_percent(tmp_path):
    # target 0.5 -> band [0.4, 0.6]; entropy 0.9 out, 0.7 out, 0.55 in (step 3), 0.3 out, 0.45 in -> 2/3
    metrics = [{"step": i + 1, "entropy": h, "target": 0.5, "band_low": None, "band_high": None}
               for i, h in enumerate([0.9, 0.7, 0.55, 0.3, 0.45])]  # fmt: skip
    run = _write_run(tmp_path / "r", metrics)
    s = summarize(run)
    assert (s["band_source"], s["first_in_band_step"]) == ("implied", 3)
    assert s["in_band_fraction"] == pytest.approx(2 / 3, abs=1e-12)
    assert "target ±20% (no band logged)" in (write_report(run) / "summary.md").read_text()


def test_in_band_is_zero_when_entropy_never_enters_its_band(tmp_path):
    # a baseline (DAPO, GRPO) logs STARE's band too: never inside it is 0% in band, not unknown
    metrics = [{"step": i + 1, "entropy": h, "target": 0.3, "band_low": 0.25, "band_high": 0.35}
               for i, h in enumerate([0.9, 0.5, 0.1])]  # fmt: skip
    s = summarize(_write_run(tmp_path / "r", metrics))
    assert (s["first_in_band_step"], s["in_band_fraction"]) == (None, 0.0)


def test_in_band_is_none_without_a_band_or_a_target(tmp_path):
    metrics = [{"step": i + 1, "entropy": h} for i, h in enumerate([0.9, 0.5])]
    s = summarize(_write_run(tmp_path / "r", metrics))
    assert (s["first_in_band_step"], s["in_band_fraction"]) == (None, None)


def test_summary_entropy_wall_time_gate_and_final_controller(tmp_path):
    s = summarize(_banded_run(tmp_path))
    assert (s["run"], s["algo"], s["steps"], s["last_step"]) == ("stare_s0", "stare", 8, 8)
    assert s["wall_time_s"] == pytest.approx(36.0)  # 1 + 2 + ... + 8
    assert (s["entropy_first"], s["entropy_last"], s["entropy_min"]) == (0.50, 0.25, 0.20)
    assert s["entropy_final"] == 0.25  # last 10% of 8 steps rounds up to 1 step
    assert s["gate_on_fraction"] == 2 / 8
    assert s["w_final"] == pytest.approx(1.35) and s["m_final"] == pytest.approx(0.65)  # 1 -+ 0.05 * 7
    assert s["band_last"] == [0.25, 0.35]  # the band the last step ran with


def test_summary_heldout_first_and_last_evaluation(tmp_path):
    s = summarize(_banded_run(tmp_path))
    assert (s["evals"], s["k"]) == (3, 4)
    assert (s["greedy_accuracy_first"], s["greedy_accuracy_last"]) == (0.2, 0.4)
    assert (s["pass_at_k_first"], s["pass_at_k_last"], s["avg_at_k_last"]) == (0.5, 0.7, 0.45)
    assert s["per_level_last"] == {"1": 0.9}


def test_write_report_writes_valid_pngs_and_summary(tmp_path):
    out = write_report(_banded_run(tmp_path))
    assert out == tmp_path / "stare_s0" / "report"
    for name in ("report", "entropy", "reward", "heldout", "response_length", "controller"):
        _assert_png(out / f"{name}.png")
    md = (out / "summary.md").read_text()
    assert "| steps in band after first entering it | 66.7% |" in md
    assert "| band (last) | [0.2500, 0.3500]: [band_low, band_high] as logged |" in md
    assert "| held-out pass@4 first / last | 0.5000 / 0.7000 |" in md


def test_baseline_run_without_controller_keys_or_evals_reports_none(tmp_path):
    metrics = [{"step": i + 1, "algo": "grpo", "entropy": 0.5 - 0.1 * i, "reward_mean": 0.1 * i} for i in range(4)]
    run = _write_run(tmp_path / "grpo_s0", metrics, evals=[])
    _assert_png(write_report(run) / "report.png")
    s = summarize(run)
    assert set(s) == set(SUMMARY_KEYS)
    none_keys = {"wall_time_s", "band_source", "in_band_fraction", "gate_on_fraction", "greedy_accuracy_last",
                 "pass_at_k_last", "k", "w_final", "m_final", "per_level_last"}  # fmt: skip
    assert {k: s[k] for k in none_keys} == dict.fromkeys(none_keys)
    assert s["evals"] == 0


def test_run_dir_without_any_files_does_not_crash(tmp_path):
    run = tmp_path / "empty"
    run.mkdir()
    s = summarize(run)
    assert (s["steps"], s["algo"], s["entropy_last"]) == (0, None, None)
    assert (write_report(run) / "report.png").exists()


def _seed_run(tmp_path: Path, name: str, algo: str, last_entropies: tuple[float, float], final_acc: float) -> Path:
    # 20 steps: the final entropy is the mean of the last 10% = 2 steps; band [0.25, 0.45] is
    # entered at step 1 (0.4): in-band fraction 1 if the last two are in the band, else 18/20.
    entropy = [0.4] * 18 + list(last_entropies)
    metrics = [{"step": i + 1, "algo": algo, "entropy": h, "target": 0.35, "band_low": 0.25, "band_high": 0.45,
                "reward_mean": 0.5, "time_step_s": 2.0} for i, h in enumerate(entropy)]  # fmt: skip
    evals = [{"step": 10, "greedy_accuracy": 0.1, "pass_at_k": 0.2, "k": 2},
             {"step": 20, "greedy_accuracy": final_acc, "pass_at_k": 0.9, "k": 2}]  # fmt: skip
    return _write_run(tmp_path / name, metrics, evals)


def _seed_runs(tmp_path: Path) -> list[Path]:
    return [
        _seed_run(tmp_path, "stare_s0", "stare", (0.30, 0.32), 0.5),  # final entropy 0.31
        _seed_run(tmp_path, "grpo_s0", "grpo", (0.10, 0.12), 0.4),  # final entropy 0.11
        _seed_run(tmp_path, "stare_s1", "stare", (0.34, 0.36), 0.7),  # final entropy 0.35
    ]


def test_compare_groups_seeds_by_algo_in_order_of_appearance(tmp_path):
    rows = compare(_seed_runs(tmp_path))
    assert [(r["algo"], r["seeds"], r["runs"]) for r in rows] == [
        ("stare", 2, ["stare_s0", "stare_s1"]),
        ("grpo", 1, ["grpo_s0"]),
    ]


def test_compare_row_values_by_hand(tmp_path):
    stare, grpo = compare(_seed_runs(tmp_path))
    # stare entropy: mean(0.31, 0.35) = 0.33, sample std = sqrt(2 * 0.02^2 / 1) = 0.02 * sqrt(2)
    assert stare["entropy_final_mean"] == pytest.approx(0.33, abs=1e-12)
    assert stare["entropy_final_std"] == pytest.approx(0.02 * math.sqrt(2), abs=1e-12)
    # stare accuracy: mean(0.5, 0.7) = 0.6, sample std = sqrt(2 * 0.1^2) = 0.1 * sqrt(2)
    assert stare["greedy_accuracy_final_mean"] == pytest.approx(0.6, abs=1e-12)
    assert stare["greedy_accuracy_final_std"] == pytest.approx(0.1 * math.sqrt(2), abs=1e-12)
    assert (stare["in_band_fraction_mean"], stare["wall_time_s_mean"]) == (1.0, 40.0)  # 20 steps x 2 s
    # one seed: a mean, no std
    assert grpo["entropy_final_mean"] == pytest.approx(0.11, abs=1e-12)
    assert (grpo["entropy_final_std"], grpo["greedy_accuracy_final_std"]) == (None, None)
    assert grpo["in_band_fraction_mean"] == 18 / 20  # 0.10 and 0.12 fall below the band


def test_write_comparison_writes_figure_and_table(tmp_path):
    out = write_comparison(_seed_runs(tmp_path), tmp_path / "cmp")
    _assert_png(out / "compare.png")
    md = (out / "compare.md").read_text()
    # two seeds: the bootstrap means are the two values and their mean (1/4, 1/2, 1/4), so the 95%
    # interval's bounds are the two values; one seed: a zero-width interval
    assert (
        "| stare | 2 | 0.3300 [0.3100, 0.3500] | 0.6000 [0.5000, 0.7000] | 100.0 [100.0, 100.0] "
        "| n/a | n/a | n/a | 0h 00m 40s (40.0 s) |"
    ) in md
    assert "| grpo | 1 | 0.1100 [0.1100, 0.1100] | 0.4000 [0.4000, 0.4000] | 90.0 [90.0, 90.0] |" in md


def test_compare_reads_pass_at_k_from_the_final_evaluations_counts(tmp_path):
    runs = _seed_runs(tmp_path)
    for run, counts in ((runs[0], [[64, 32], [64, 0]]), (runs[2], [[64, 64], [64, 0]])):
        evals = load_jsonl(run / "eval.jsonl")
        evals[-1]["correct_counts"] = counts
        (run / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    stare, grpo = compare(runs)
    # pass@1 = c / n per problem: (0.5 + 0) / 2 = 0.25 and (1 + 0) / 2 = 0.5; pass@64 = 0.5 on both
    assert stare["pass_at_k_ci"][1] == pytest.approx((0.375, 0.25, 0.5))
    assert stare["pass_at_k_ci"][64] == pytest.approx((0.5, 0.5, 0.5))
    assert grpo["pass_at_k_ci"][1] is None
