"""`stare up` hands the API token only to the control plane: the learner, rollout and reward
processes it spawns run without STARE_API_TOKEN in their environment (they never need it). And the
record key (STARE_RECORD_KEY_FILE, who may feed the learner) only to those three, not to the control
plane, the one role that faces the network."""

from __future__ import annotations

import io
import sys
import time

from stare.app.launch.processes import ProcessLauncher as Launcher
from stare.config import build_config
from stare.transport.redis_secrets import write_secret

PRINT_TOKEN = (
    "import os; print('token=' + os.environ.get('STARE_API_TOKEN', '<none>') + ' key=' + "
    "os.environ.get('STARE_RECORD_KEY_FILE', '<none>'))"
)


def test_only_the_control_plane_process_gets_the_api_token_and_only_the_others_the_record_key(
    tiny_model_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("STARE_API_TOKEN", "secret-token-0123456789")
    monkeypatch.setenv("STARE_RECORD_KEY_FILE", "/somewhere/else")  # the launcher's own, never the control's
    cfg = build_config({}, overrides=[f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path}", "run.name=env"])
    out = io.StringIO()
    launcher = Launcher(cfg, rollout=1, reward=1, redis_url="redis://127.0.0.1:1/0", out=out, color=False)
    launcher.redis_url_file = write_secret(launcher.dir / "redis.url", launcher.redis_url)
    launcher.record_key_file = launcher._record_key_file()
    key = launcher.dir / "record.key"
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_text().strip()) == 64
    first = key.read_text()
    assert launcher._record_key_file() == key and key.read_text() == first  # kept across invocations
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
        "control": "token=secret-token-0123456789 key=<none>",
        "learner": f"token=<none> key={key}",
        "rollout-0": f"token=<none> key={key}",
        "reward-0": f"token=<none> key={key}",
    }
