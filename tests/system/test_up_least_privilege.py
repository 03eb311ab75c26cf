"""`stare up` hands the API token only to the control plane: the learner, rollout and reward
processes it spawns run without STARE_API_TOKEN in their environment (they never need it)."""

from __future__ import annotations

import io
import sys
import time

from stare.app.launch.processes import ProcessLauncher as Launcher
from stare.config import build_config
from stare.transport.redis_secrets import write_secret

PRINT_TOKEN = "import os; print('token=' + os.environ.get('STARE_API_TOKEN', '<none>'))"


def test_only_the_control_plane_process_gets_the_api_token(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("STARE_API_TOKEN", "secret-token-0123456789")
    cfg = build_config({}, overrides=[f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path}", "run.name=env"])
    out = io.StringIO()
    launcher = Launcher(cfg, rollout=1, reward=1, redis_url="redis://127.0.0.1:1/0", out=out, color=False)
    launcher.redis_url_file = write_secret(launcher.dir / "redis.url", launcher.redis_url)
    for role in launcher.roles.values():
        role.argv = [sys.executable, "-c", PRINT_TOKEN]  # the real environment, a command that shows it
        launcher._spawn(role)
    for role in launcher.roles.values():
        assert role.proc.wait(timeout=60) == 0
    deadline = time.monotonic() + 30  # the output pumps (threads) finish reading after the exit
    while out.getvalue().count("token=") < len(launcher.roles) and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = dict(line.split(" | ") for line in out.getvalue().splitlines() if "token=" in line)
    assert {k.strip(): v for k, v in lines.items()} == {
        "control": "token=secret-token-0123456789",
        "learner": "token=<none>",
        "rollout-0": "token=<none>",
        "reward-0": "token=<none>",
    }
