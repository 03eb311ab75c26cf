"""`stare bench`: names, help, the child-process runner, the table and the JSON file."""

import io
import json
import subprocess
import sys

from stare.app.bench.registry import BENCHMARKS
from stare.app.cli import main


def test_help_lists_every_benchmark_and_bench_is_a_command():
    top = subprocess.run([sys.executable, "-m", "stare.app.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert "bench" in top.stdout
    out = subprocess.run(
        [sys.executable, "-m", "stare.app.cli", "bench", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0
    for name in BENCHMARKS:
        assert f"  {name} " in out.stdout


def test_unknown_benchmark_exits_2_listing_the_valid_names(capsys):
    assert main(["bench", "lossy"]) == 2
    assert "valid names: loss, transport" in capsys.readouterr().err


def test_suite_runs_each_benchmark_in_a_child_and_writes_rows_and_machine(tmp_path):
    from stare.app.bench.suite import run_suite

    out = io.StringIO()
    rows = run_suite(["gpu-generate"], quick=True, json_path=tmp_path / "r.json", out=out, say=lambda s: None)
    assert [r["name"] for r in rows] == ["gpu-generate"]  # a skipped row on CPU, the row itself on a GPU
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["rows"] == rows and saved["quick"] is True and saved["benchmarks"] == ["gpu-generate"]
    assert saved["machine"]["cores"] >= 1 and saved["machine"]["packages"]["torch"]
    assert saved["seconds"]["gpu-generate"] > 0
    assert "| gpu-generate |" in out.getvalue()


def test_a_benchmark_that_cannot_finish_in_time_becomes_an_error_row(tmp_path):
    from stare.app.bench.suite import run_isolated

    (r,) = run_isolated("loss", quick=False, workdir=tmp_path, timeout_s=0.5)
    assert r["name"] == "loss" and "did not finish within 0s" in r["error"] and r["pass"] is None
