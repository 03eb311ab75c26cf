"""The row, the table, the registry's selection and the machine description."""

import json
import math

import pytest

from stare.app.bench.common import failed, format_table, interleave, machine, paired_row, row, skipped
from stare.app.bench.registry import BENCHMARKS, SECTIONS, select


def test_row_ratio_is_ours_over_baseline_and_pass_follows_the_direction():
    fast = row("x", "w", ours=3.0, baseline=2.0, unit="records/s", target=1.4)  # 1.5 >= 1.4
    slow = row("y", "w", ours=3.0, baseline=2.0, unit="s", target=1.4, higher_is_better=False)  # 1.5 > 1.4
    assert fast["ratio"] == 1.5 and fast["pass"] is True
    assert slow["ratio"] == 1.5 and slow["pass"] is False
    assert row("z", "w", ours=1.0, baseline=4.0, unit="s")["pass"] is None  # no target: a breakdown


def test_paired_row_takes_medians_and_the_range_of_per_repeat_ratios():
    r = paired_row("x", "w", [2.0, 4.0, 9.0], [1.0, 2.0, 3.0], unit="s")
    assert (r["ours"], r["baseline"]) == (4.0, 2.0)  # medians of each arm
    assert r["spread"] == [2.0, 3.0]  # ratios 2, 2, 3
    assert r["repeats"] == 3


def test_paired_row_ratio_is_the_median_of_the_per_repeat_ratios():
    r = paired_row("x", "w", [5.0, 4.0, 6.0], [1.0, 2.0, 3.0], unit="GB/s", target=2.4)
    assert (r["ours"], r["baseline"]) == (5.0, 2.0)  # medians of each arm
    assert r["ratio"] == 2.0  # ratios 5, 2, 2 -> median 2 (not 5 / 2 = 2.5)
    assert r["pass"] is False and r["spread"] == [2.0, 5.0] and r["ratio_of"] == "pairs"


def test_paired_row_can_take_the_ratio_of_the_medians_for_arms_not_run_back_to_back():
    r = paired_row("x", "w", [5.0, 4.0, 6.0], [1.0, 2.0, 3.0], unit="GB/s", target=2.4, median_of_ratios=False)
    assert r["ratio"] == 2.5 and r["pass"] is True and "ratio_of" not in r


def test_row_refuses_a_zero_or_infinite_baseline():
    with pytest.raises(ValueError, match="baseline"):
        row("x", "w", ours=1.0, baseline=0.0, unit="s")
    with pytest.raises(ValueError, match="finite"):
        row("x", "w", ours=math.inf, baseline=1.0, unit="s")


def test_interleave_rotates_which_arm_goes_first_after_the_warmup():
    calls = []
    out = interleave({"a": lambda: calls.append("a") or 1, "b": lambda: calls.append("b") or 2}, repeats=3, warmup=1)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert out == {"a": [1, 1, 1], "b": [2, 2, 2]}


def test_table_shows_each_row_and_says_why_one_was_skipped_or_failed():
    rows = [
        row("fast", "w", ours=2.0, baseline=1.0, unit="x", target=1.5),
        skipped("gpu", "w", "no CUDA device"),
        failed("broken", "w", "RuntimeError: boom"),
    ]
    table = format_table(rows)
    lines = table.splitlines()
    assert lines[2].startswith("| fast |") and lines[2].endswith("| >= 1.5 | yes |")
    assert "| gpu |" in table and "gpu: skipped: no CUDA device" in table
    assert "| broken |" in table and "ERROR" in table and "broken: error: RuntimeError: boom" in table


def test_select_expands_sections_keeps_order_and_names_valid_choices():
    assert select([]) == list(BENCHMARKS)
    assert select(["gpu"]) == SECTIONS["gpu"] and all(BENCHMARKS[n].gpu for n in SECTIONS["gpu"])
    assert select(["step", "loss", "step"]) == ["step", "loss"]
    with pytest.raises(ValueError, match="valid names: loss, transport"):
        select(["nope"])


def test_machine_description_is_json_and_names_cpu_cores_and_versions():
    m = json.loads(json.dumps(machine()))
    assert m["cores"] >= 1 and m["cpu"] and m["packages"]["torch"] and m["packages"]["stare"] == "0.1.0"
    assert "cuda" in m and "load_avg_1_5_15" in m


def test_batch_pairs_row_ratio_is_the_median_over_every_pair_of_calls():
    from stare.app.bench.bench_transport import batch_pairs_row

    # two rounds of (records, seconds) calls: ours then raw; per-pair ratios 1.0, 0.5, 2.0 | 0.8, 1.0
    rounds = [
        ([(10, 1.0), (10, 2.0), (10, 1.0)], [(10, 1.0), (10, 1.0), (10, 2.0)]),
        ([(10, 1.25), (8, 1.0)], [(10, 1.0), (8, 1.0)]),
    ]
    r = batch_pairs_row("t", "w", rounds)
    assert r["ratio"] == pytest.approx(1.0)  # median of [1.0, 0.5, 2.0, 0.8, 1.0]
    assert r["spread"] == pytest.approx([0.9, 1.0])  # the rounds' medians: 1.0 and (0.8 + 1.0) / 2
    assert r["ours"] == pytest.approx(8.0) and r["baseline"] == pytest.approx(10.0)  # median records/s per call
    assert r["pairs"] == 5 and r["repeats"] == 2 and r["ratio_of"] == "call pairs"


def test_overlap_steps_per_min_is_60_over_the_median_step_time_after_the_warmup():
    from stare.app.bench.bench_overlap import steps_per_min

    ends = [100.0, 103.0, 103.5, 104.0, 104.6, 105.2, 111.0]  # steps 1-7 end; step 2 and step 7 are slow
    assert steps_per_min(ends, warmup=2) == pytest.approx(60.0 / 0.6)  # steps 3-7 took 0.5, 0.5, 0.6, 0.6, 5.8 s
