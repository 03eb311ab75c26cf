"""`stare sandbox run FILE.py`: JSON verdict and exit code, in-process and as a module."""

import json
import os
import subprocess
import sys

import pytest

from reward.sandbox_cli import excerpt, main
from stare.sandbox import probe


@pytest.fixture
def isolation():
    level = "namespaces" if probe("namespaces") is None else "unprivileged"
    if level != "namespaces" and os.environ.get("CI") == "true":
        pytest.fail("namespaces isolation unavailable on CI")
    return level


def test_ok_program_prints_an_ok_verdict(tmp_path, capsys, isolation):
    program = tmp_path / "p.py"
    program.write_text("print('hi')")
    code = main(["run", str(program), "--isolation", isolation])
    verdict = json.loads(capsys.readouterr().out)
    assert (code, verdict["status"], verdict["stdout"], verdict["limit_fired"]) == (0, "ok", "hi\n", None)


def test_cpu_hog_reports_the_limit_that_fired(tmp_path, capsys, isolation):
    program = tmp_path / "loop.py"
    program.write_text("while True:\n    pass\n")
    code = main(["run", str(program), "--cpu-s", "1", "--wall-s", "20", "--isolation", isolation])
    verdict = json.loads(capsys.readouterr().out)
    assert (code, verdict["status"], verdict["limit_fired"]) == (1, "timeout", "cpu_s")


def test_stdin_file_is_fed_to_the_program(tmp_path, capsys, isolation):
    program = tmp_path / "p.py"
    program.write_text("print(input().upper())")
    (tmp_path / "in.txt").write_text("abc\n")
    main(["run", str(program), "--stdin", str(tmp_path / "in.txt"), "--isolation", isolation])
    assert json.loads(capsys.readouterr().out)["stdout"] == "ABC\n"


def test_missing_file_is_a_usage_error(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.py")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_invalid_limit_is_a_usage_error_naming_it(tmp_path, capsys):
    program = tmp_path / "p.py"
    program.write_text("pass")
    assert main(["run", str(program), "--memory-mb", "1"]) == 2
    assert "memory_mb" in capsys.readouterr().err


def test_module_entry_point_prints_the_verdict(tmp_path, isolation):
    program = tmp_path / "p.py"
    program.write_text("import sys\nsys.exit(4)")
    proc = subprocess.run(
        [sys.executable, "-m", "reward.sandbox_cli", "run", str(program), "--isolation", isolation],
        capture_output=True,
        text=True,
        timeout=60,
    )
    verdict = json.loads(proc.stdout)
    assert (proc.returncode, verdict["status"], verdict["exit_code"]) == (1, "error", 4)


def test_excerpt_keeps_head_and_tail():
    assert excerpt("abcdefghij", 4) == "ab\n...[6 characters cut]...\nij"
