"""The import contracts (pyproject.toml [tool.importlinter]: the layers, no cycle) hold on the
source tree, and a planted wrong import or cycle breaks them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("stare", "learner", "rollout", "reward", "services")  # the import roots (pyproject.toml)


def _source_tree(dest: Path) -> Path:
    """A copy of the packages as they stand in the repository (the roles are top-level packages, so
    import-linter reads the source tree itself; the copy is only for planting wrong imports)."""
    for top in PACKAGES:
        shutil.copytree(ROOT / top, dest / top, ignore=shutil.ignore_patterns("__pycache__", "static"))
    return dest


def _lint(tree: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(exe), "--no-cache", "--config", str(ROOT / "pyproject.toml")],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
    )


def test_the_layer_contracts_hold_on_the_source_tree():
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 4 kept, 0 broken" in result.stdout


def test_a_planted_import_cycle_breaks_the_acyclic_contract(tmp_path):
    tree = _source_tree(tmp_path)
    path = tree / "stare/data/tasks/base.py"  # the registry imports base: base importing it closes a loop
    path.write_text(path.read_text() + "\nimport stare.data.tasks.registry  # planted by the test\n")
    result = _lint(tree)
    assert result.returncode != 0
    assert "no import cycle" in result.stdout and "BROKEN" in result.stdout and ".base -> .registry" in result.stdout


@pytest.mark.parametrize(
    "module, planted",
    [
        ("stare/transport/records.py", "import stare.app.launch.embedded"),  # core -> application
        ("stare/config/__init__.py", "import learner.step.trainer"),  # core -> role
        ("learner/step/trainer.py", "import rollout.engines.base"),  # role -> another role
        ("learner/algorithm/surrogate.py", "import learner.loop.session"),  # a learner room -> a room above it
    ],
)
def test_a_planted_wrong_import_breaks_the_contract(tmp_path, module, planted):
    tree = _source_tree(tmp_path)
    path = tree / module
    path.write_text(path.read_text() + f"\n{planted}  # planted by the test\n")
    result = _lint(tree)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout and planted.split()[-1] in result.stdout


# the sandbox launcher runs as one stdlib-only file in the sandboxed process (docs/sandbox.md)
LONG_MODULE_EXCEPTIONS = {"stare/sandbox/_launcher.py"}


def _tracked_python_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    return [f for f in out if (ROOT / f).is_file()]


def test_no_module_outside_tests_is_over_400_lines():
    long = {
        f: n
        for f in _tracked_python_files()
        if not f.startswith("tests/") and (n := len((ROOT / f).read_text(encoding="utf-8").splitlines())) > 400
    }
    assert set(long) <= LONG_MODULE_EXCEPTIONS, f"split these by purpose: {long}"


def test_every_package_is_installed():
    """A package missing from [tool.setuptools] packages works in a checkout and is absent from a
    wheel (the Docker images install one)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {
        ".".join(init.parent.relative_to(ROOT).parts) for top in PACKAGES for init in (ROOT / top).rglob("__init__.py")
    }
    found |= {f"stare.{folder}" for folder in setuptools["package-dir"].values()}  # configs/: data only
    assert found == set(setuptools["packages"])


def test_the_learner_keeps_at_most_eight_entries_at_its_top():
    entries = [p.name for p in (ROOT / "learner").iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 8, sorted(entries)


def test_stare_keeps_a_handful_of_entries_at_its_top():
    entries = [p.name for p in (ROOT / "stare").iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 13, sorted(entries)
