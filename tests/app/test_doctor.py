"""`stare doctor`: its registry, its report's schema, a group that hangs or crashes, and the whole doctor on this
CPU machine (every GPU check skipped with its reason, every other check passing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import jsonschema
import pytest

from stare.app.doctor.registry import Context, Group, Row, all_checks
from stare.app.doctor.report import SCHEMA, build_report, render
from stare.app.doctor.runner import run_group


def test_a_report_with_every_status_validates_and_a_skip_without_its_reason_does_not():
    rows = [
        Row("engine.hf_sampling", "pass", "", {"tokens_per_s": 12.5, "device": "cpu"}, 1.0),
        Row("engine.vllm_sleep", "skip", "vllm is not installed here"),
        Row("config.plan", "fail", "the learner needs 90 GiB", {"free_gib": 70.0}),
    ]
    report = build_report(rows, 3.0, Context(out="/tmp"))
    jsonschema.validate(report, SCHEMA)
    assert report["summary"] == {"pass": 1, "fail": 1, "skip": 1}
    assert "engine.vllm_sleep" in render(report) and "1 passed, 1 failed, 1 skipped" in render(report)
    report["checks"][1]["why"] = ""
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, SCHEMA)


def test_every_check_is_named_by_its_group_documented_and_listed_in_the_help():
    from stare.app.cli.epilogs import doctor_epilog

    names = [c.name for _, c in all_checks()]
    assert len(names) == len(set(names))
    epilog = doctor_epilog()
    for group, check in all_checks():
        assert check.name.split(".")[0] == group.name
        assert check.what and check.failure and check.fix, check.name
        assert check.name in epilog, check.name


HANGING = """
import time
from stare.app.doctor.registry import Check, Row

CHECKS = [Check("hang.first", "w", "f", "x"), Check("hang.second", "w", "f", "x")]


def run(ctx, report):
    report(Row("hang.first", "pass", "", {"n": 1}, 0.1))
    time.sleep(600)  # a check that never returns (an NCCL op, a driver call)
"""

CRASHING = """
import os
from stare.app.doctor.registry import Check

CHECKS = [Check("crash.only", "w", "f", "x")]


def run(ctx, report):
    print("about to die")
    os._exit(3)
"""


@pytest.fixture
def group_module(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{monkeypatch.delenv('PYTHONPATH', raising=False) or ''}")
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, text: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
        return name

    return write


def test_a_group_that_hangs_is_stopped_at_its_limit_keeping_the_rows_it_reported(group_module, tmp_path):
    group = Group("hang", group_module("doctor_hang", HANGING), 3.0, "a hanging check")
    t0 = time.monotonic()
    first, second = run_group(group, Context(out=str(tmp_path)))
    assert time.monotonic() - t0 < 30  # its limit and the kill, not the check's 600 s
    assert (first.check, first.status) == ("hang.first", "pass")
    assert (second.check, second.status) == ("hang.second", "fail")
    assert "did not finish within 3 s" in second.why


def test_a_group_that_crashes_fails_its_checks_with_its_exit_code_and_output(group_module, tmp_path):
    (row,) = run_group(
        Group("crash", group_module("doctor_crash", CRASHING), 30.0, "a crash"), Context(out=str(tmp_path))
    )
    assert row.status == "fail" and "exited with code 3" in row.why and "about to die" in row.why


def test_an_unknown_group_is_refused_naming_the_option_and_the_groups(capsys):
    from stare.app.cli import main

    assert main(["doctor", "--only", "engine,nope"]) == 2
    first = capsys.readouterr().err.strip().splitlines()[0]
    assert first == (
        "stare: --only: unknown group(s) ['nope']; the groups are environment, topology, engine, weights, "
        "learner, config"
    )


@pytest.mark.slow
def test_the_doctor_on_a_cpu_skips_every_gpu_check_with_its_reason_and_passes_every_other(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this test is the CPU part of the doctor")
    # a launcher's rendezvous left in the environment (rank 3 of 4 on a port nobody serves) is not the doctor's
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "9", "WORLD_SIZE": "4", "RANK": "3"}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "stare.app.cli", "doctor", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
    )
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "doctor.json").read_text())
    jsonschema.validate(report, SCHEMA)
    rows = {r["check"]: r for r in report["checks"]}
    assert set(rows) == {c.name for _, c in all_checks()}
    for _, check in all_checks():
        row = rows[check.name]
        if check.gpu:
            assert row["status"] == "skip" and row["why"], row
        else:
            assert row["status"] == "pass", row
    assert "report:" in proc.stdout and "failed" in proc.stdout
    print(f"stare doctor on this CPU machine: {seconds:.0f} s")
