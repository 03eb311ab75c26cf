"""Shared checks of the deployment artefacts (compose, Kubernetes, Ray): the `stare` command lines
they run and the environment variables they set, against the code."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The packages whose source is "the code" (pyproject.toml's package-dir), not deploy/ itself.
SOURCE_DIRS = ["stare", "learner", "rollout", "reward", "services"]

# Variables read by a library, not by stare: name -> the installed module whose source reads it.
LIBRARY_ENV = {"HF_HUB_OFFLINE": "huggingface_hub.constants", "TORCH_EXTENSIONS_DIR": "torch.utils.cpp_extension"}
# Read by a native library, not by Python code (no source here to grep): the reason each is set.
NATIVE_ENV = {"NCCL_HOSTID": "libnccl's host hash (docs/deploy.md, NCCL inside compose and Kubernetes)"}


def registered_subcommands() -> set[str]:
    from stare.app.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def check_stare_argv(argv: list[str], where: str) -> None:
    """Fail when `stare *argv` is not a valid command line of stare.app.cli."""
    assert argv, f"{where}: empty command"
    assert argv[0] in registered_subcommands(), f"{where}: `stare {argv[0]}` is not a subcommand of stare.app.cli"
    from stare.app.cli import parse_args

    try:
        parse_args(argv)
    except SystemExit as err:
        pytest.fail(f"{where}: `stare {' '.join(argv)}` does not parse (exit {err.code})")


def _source_texts(dirs: list[Path]) -> str:
    return "\n".join(p.read_text(errors="replace") for d in dirs for p in d.rglob("*.py"))


def code_reads_env(name: str) -> bool:
    """Whether stare's source names `name` as a string literal (os.environ[...], getenv(...))."""
    text = _source_texts([REPO / d for d in SOURCE_DIRS])
    return re.search(rf"""["']{re.escape(name)}["']""", text) is not None


def check_env_name(name: str, where: str) -> None:
    """Fail unless the code (or the library named in LIBRARY_ENV) reads `name`."""
    if name in NATIVE_ENV:
        return
    if name in LIBRARY_ENV:
        import importlib

        module = importlib.import_module(LIBRARY_ENV[name])
        assert name in Path(module.__file__).read_text(), f"{where}: {LIBRARY_ENV[name]} no longer reads {name}"
        return
    if code_reads_env(name):
        return
    pytest.fail(f"{where}: sets {name}, which no code reads (grep of {', '.join(SOURCE_DIRS)})")


def control_plane_status(path: str) -> int:
    """HTTP status of GET `path` on the control plane's FastAPI app (in-memory run state, no Redis);
    404 means the app does not serve the path."""
    from fastapi.testclient import TestClient

    from services.control.app import create_app
    from stare.config import ControlPlaneSection
    from stare.runstate.in_memory import MemoryRunState

    app = create_app(
        MemoryRunState("probe"), ControlPlaneSection(trusted_hosts=["testserver"]), "probe", token="probe-token"
    )
    return TestClient(app).get(path).status_code


def role_health_path_served() -> bool:
    """Whether the roles' health server answers GET /healthz (its path literal in the source)."""
    text = _source_texts([REPO / d for d in SOURCE_DIRS])
    return re.search(r"""["']/healthz["']""", text) is not None
