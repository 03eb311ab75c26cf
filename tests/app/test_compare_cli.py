"""`stare compare`: existing run folders compared as they are (nothing trained), trained runs named
without doubling, the last evaluation's samples raised only when the table needs them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from stare.app.cli import main
from stare.app.cli.compare import final_samples_override, run_name
from stare.config import build_config


def _run(folder: Path, algo: str, entropies: list[float], counts: list[list[int]]) -> Path:
    folder.mkdir(parents=True)
    rows = [{"step": i + 1, "algo": algo, "entropy": h, "target": 0.3, "band_low": 0.25, "band_high": 0.35,
             "reward_mean": 0.5, "time_step_s": 1.0} for i, h in enumerate(entropies)]  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    final = {"step": len(entropies), "greedy_accuracy": 0.5, "correct_counts": counts}
    (folder / "eval.jsonl").write_text(json.dumps(final) + "\n")
    return folder


def test_existing_run_folders_are_compared_without_training(tmp_path, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError(f"compare trained a run: {args}")

    monkeypatch.setattr(subprocess, "run", no_training)
    stare = _run(tmp_path / "runs" / "a-stare-s0", "stare", [0.3, 0.3], [[4, 2], [4, 0]])
    # DAPO's entropy falls below STARE's band and never enters it: 0% in band, not n/a
    dapo = _run(tmp_path / "runs" / "a-dapo-s0", "dapo", [0.2, 0.1], [[4, 4], [4, 1]])
    assert main(["compare", str(stare), str(dapo), "--pass-k", "1,4"]) == 0
    table = (tmp_path / "runs" / "compare" / "compare.md").read_text()
    assert "pass@4 |" in table and "pass@64" not in table
    dapo_row = next(line for line in table.splitlines() if line.startswith("| dapo |"))
    # final entropy: the mean of the last step (10% of 2 steps rounds up to 1); in band 0.0%; pass@1 = mean
    # of c/n over problems (4/4, 1/4 -> 0.625), pass@4 = 1 for both problems
    assert "| 0.1000 [0.1000, 0.1000] |" in dapo_row and "| 0.0 [0.0, 0.0] |" in dapo_row
    assert "| 0.6250 [0.6250, 0.6250] | 1.0000 [1.0000, 1.0000] |" in dapo_row
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["a-dapo-s0", "a-stare-s0", "compare"]


def test_a_folder_that_is_not_a_run_is_one_line(tmp_path, capsys):
    assert main(["compare", str(tmp_path)]) == 2
    assert "not a run folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    "base, algo, name",
    [("cmp", "grpo", "cmp-grpo-s0"), ("tiny-stare", "grpo", "tiny-grpo-s0"), ("x-grpo-ds", "stare", "x-stare-s0")],
)
def test_trained_runs_are_named_once(base, algo, name):
    assert run_name(base, algo, 0) == name


def test_the_last_evaluation_samples_more_only_when_the_table_needs_it():
    cfg = build_config({"task": {"eval_k": 4}})
    assert final_samples_override(cfg, [], (1, 8, 64)) == ["task.final_eval_k=64"]
    assert final_samples_override(cfg, [], (1, 4)) == []  # its 4 samples give pass@4
    assert final_samples_override(cfg, ["task.final_eval_k=16"], (1, 64)) == []  # the user's choice stands
    assert final_samples_override(build_config({"task": {"final_eval_k": 128}}), [], (1, 64)) == []
