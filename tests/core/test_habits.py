"""The field's habits are enforced, not hoped for: scripts/lint.sh (run by scripts/test.sh, so by CI)
fails on an unformatted file, a lint error and a type error in the strictly typed core, as it fails on
a wrong import (tests/core/test_layers.py). Each test plants one fault in a copy and runs the tool
with the project's configuration."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(tool: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / tool), *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_the_tree_is_formatted_and_lint_clean():
    assert _run("ruff", "format", "--check", ".").returncode == 0
    assert _run("ruff", "check", ".").returncode == 0


def test_an_unformatted_file_fails_the_format_check(tmp_path):
    path = tmp_path / "ugly.py"
    path.write_text("def f( a,b ):\n  return {'a':a,'b':b}\n")
    result = _run("ruff", "format", "--check", "--config", str(ROOT / "pyproject.toml"), str(path))
    assert result.returncode == 1 and "would be reformatted" in result.stdout


def test_an_unused_import_fails_the_lint(tmp_path):
    path = tmp_path / "unused.py"
    path.write_text("import os\n\n\ndef f() -> int:\n    return 1\n")
    result = _run("ruff", "check", "--config", str(ROOT / "pyproject.toml"), str(path))
    assert result.returncode == 1 and "F401" in result.stdout


def test_a_type_error_in_the_core_fails_the_type_checker(tmp_path):
    """A copy of a strictly typed core module with a planted error, checked under the project's
    [tool.mypy] settings: mypy reports it (the unplanted copy passes, so the fault is the plant)."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "stare" / "config", tree / "stare" / "config", ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "stare" / "__init__.py").write_text("")
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    clean = _run("mypy", "--no-incremental", "stare/config/staleness.py", cwd=tree)
    assert clean.returncode == 0, clean.stdout
    path = tree / "stare" / "config" / "staleness.py"
    path.write_text(path.read_text() + "\n\ndef planted() -> int:\n    return staleness\n")
    planted = _run("mypy", "--no-incremental", "stare/config/staleness.py", cwd=tree)
    assert planted.returncode == 1 and "staleness.py" in planted.stdout and "return-value" in planted.stdout
