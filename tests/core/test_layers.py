"""The import contracts (pyproject.toml [tool.importlinter]: the layers, no cycle) hold for the
package as it installs, and a planted wrong import or cycle breaks them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _installed_layout(dest: Path) -> Path:
    """The `stare` package as setuptools installs it (roles live at the top level of the repo and
    install as stare.learner, ...): import-linter reads a package from one directory tree."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, folder in sorted(setuptools["package-dir"].items(), key=lambda kv: kv[0].count(".")):
        target = dest / package.replace(".", "/")
        shutil.copytree(ROOT / folder, target, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "static"))
    return dest


def _lint(tree: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(exe), "--no-cache", str(ROOT / "pyproject.toml")], cwd=tree, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})


def test_the_layer_contracts_hold(tmp_path):
    result = _lint(_installed_layout(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken" in result.stdout


def test_a_planted_import_cycle_breaks_the_acyclic_contract(tmp_path):
    tree = _installed_layout(tmp_path)
    path = tree / "stare/data/tasks/base.py"  # the registry imports base: base importing it closes a loop
    path.write_text(path.read_text() + "\nimport stare.data.tasks.registry  # planted by the test\n")
    result = _lint(tree)
    assert result.returncode != 0
    assert "no import cycle" in result.stdout and "BROKEN" in result.stdout and ".base -> .registry" in result.stdout


@pytest.mark.parametrize("module, planted", [
    ("stare/transport/records.py", "import stare.app.launch.embedded"),  # core -> application
    ("stare/config/__init__.py", "import stare.learner.trainer"),  # core -> role
    ("stare/learner/trainer.py", "import stare.rollout.engine"),  # role -> another role
])
def test_a_planted_wrong_import_breaks_the_contract(tmp_path, module, planted):
    tree = _installed_layout(tmp_path)
    path = tree / module
    path.write_text(path.read_text() + f"\n{planted}  # planted by the test\n")
    result = _lint(tree)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout and planted.split()[-1] in result.stdout


# the sandbox launcher runs as one stdlib-only file in the sandboxed process (docs/sandbox.md)
LONG_MODULE_EXCEPTIONS = {"stare/sandbox/_launcher.py"}


def _tracked_python_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.py"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    return [f for f in out if (ROOT / f).is_file()]


def test_no_module_outside_tests_is_over_400_lines():
    long = {f: n for f in _tracked_python_files() if not f.startswith("tests/")
            and (n := len((ROOT / f).read_text(encoding="utf-8").splitlines())) > 400}
    assert set(long) <= LONG_MODULE_EXCEPTIONS, f"split these by purpose: {long}"


def test_every_package_under_stare_is_installed():
    """A package missing from [tool.setuptools] packages works in an editable checkout and is absent
    from a wheel (the Docker images install one)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {folder: package for package, folder in setuptools["package-dir"].items()}
    found = set()
    for init in ROOT.rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        top = rel.parts[0]
        if top in folders:
            found.add(".".join([folders[top], *rel.parts[1:]]))
    assert found == set(setuptools["packages"])


def test_stare_keeps_a_handful_of_entries_at_its_top():
    entries = [p.name for p in (ROOT / "stare").iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 12, sorted(entries)
