"""Shared checks of the deployment artefacts (compose, Kubernetes, Ray): the `stare` command lines
they run and the environment variables they set, against the code and the roles' contract."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The packages whose source is "the code" (pyproject.toml's package-dir), not deploy/ itself.
SOURCE_DIRS = ["stare", "learner", "rollout", "reward", "services"]

# The roles' command-line contract (issue 7). Used only for subcommands not registered yet; once a
# subcommand exists, its real argparse parser is the judge.
CONTRACT_FLAGS = {
    "rollout": {"--config", "--set", "--redis-url", "--name"},
    "reward": {"--config", "--set", "--redis-url", "--name"},
    "learner": {"--config", "--set", "--redis-url", "--name"},
    "control": {"--config", "--redis-url", "--host", "--port"},
    "up": {"--config", "--rollout", "--reward", "--redis-url"},
}
# Variables the roles' contract says the code reads; until it does, a check skips with the reason.
CONTRACT_ENV = {"STARE_REDIS_URL", "STARE_API_TOKEN", "STARE_HEALTH_PORT", "STARE_WORKER_NAME", "STARE_CACHE_DIR"}
# Variables read by a library, not by stare: name -> the installed module whose source reads it.
LIBRARY_ENV = {"HF_HUB_OFFLINE": "huggingface_hub.constants", "TORCH_EXTENSIONS_DIR": "torch.utils.cpp_extension"}


def registered_subcommands() -> set[str]:
    from stare.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def check_stare_argv(argv: list[str], where: str) -> None:
    """Fail when `stare *argv` is not a valid command line. A subcommand not registered yet is
    checked against CONTRACT_FLAGS and then skipped, so the real check starts when it lands."""
    assert argv, f"{where}: empty command"
    sub = argv[0]
    if sub in registered_subcommands():
        from stare.cli import build_parser

        try:
            build_parser().parse_args(argv)
        except SystemExit as err:
            pytest.fail(f"{where}: `stare {' '.join(argv)}` does not parse (exit {err.code})")
        return
    assert sub in CONTRACT_FLAGS, f"{where}: `stare {sub}` is neither a registered subcommand nor in the contract"
    flags = {a.split("=", 1)[0] for a in argv[1:] if a.startswith("--")}
    assert flags <= CONTRACT_FLAGS[sub], f"{where}: flags {sorted(flags - CONTRACT_FLAGS[sub])} not in the contract of `stare {sub}`"
    pytest.skip(f"`stare {sub}` is not registered in stare.cli yet; checked against the contract only")


def _source_texts(dirs: list[Path]) -> str:
    return "\n".join(p.read_text(errors="replace") for d in dirs for p in d.rglob("*.py"))


def code_reads_env(name: str) -> bool:
    """Whether stare's source names `name` as a string literal (os.environ[...], getenv(...))."""
    text = _source_texts([REPO / d for d in SOURCE_DIRS])
    return re.search(rf"""["']{re.escape(name)}["']""", text) is not None


def check_env_name(name: str, where: str) -> None:
    """Fail unless the code (or the library named in LIBRARY_ENV) reads `name`; skip for a contract
    variable the code does not read yet."""
    if name in LIBRARY_ENV:
        import importlib

        module = importlib.import_module(LIBRARY_ENV[name])
        assert name in Path(module.__file__).read_text(), f"{where}: {LIBRARY_ENV[name]} no longer reads {name}"
        return
    if code_reads_env(name):
        return
    if name in CONTRACT_ENV:
        pytest.skip(f"{name} is in the roles' contract but the code does not read it yet")
    pytest.fail(f"{where}: sets {name}, which no code reads (grep of {', '.join(SOURCE_DIRS)})")


def control_plane_status(path: str) -> int:
    """HTTP status of GET `path` on the control plane's FastAPI app (in-memory run state, no Redis);
    404 means the app does not serve the path."""
    try:
        from stare.config import ControlSection
        from stare.runstate.memory import MemoryRunState
        from stare.services.control.app import create_app
    except ImportError as err:
        pytest.skip(f"the control plane is not importable yet: {err}")
    from fastapi.testclient import TestClient

    app = create_app(MemoryRunState("probe"), ControlSection(), "probe", token="probe-token")
    return TestClient(app).get(path).status_code


def role_health_path_served() -> bool:
    """Whether the roles' health server answers GET /healthz (its path literal in the source)."""
    text = _source_texts([REPO / d for d in SOURCE_DIRS])
    return re.search(r"""["']/healthz["']""", text) is not None
