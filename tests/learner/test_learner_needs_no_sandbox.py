"""With tool use on, the distributed learner's evaluator (through the streams) builds no rollout
engine, no tool agent and no sandbox: the learner container needs no SYS_ADMIN (the rollout
workers run the tools). Checked in a fresh process by what it built and imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from redis_fixtures import have_redis_server, redis_server

from learner.engine.deepspeed_engine import child_env

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not have_redis_server(), reason="needs redis-server on PATH")]

SCRIPT = """
import json, sys
from stare.config import build_config
from stare.models.resolve import load_run_setup
from stare.app.launch.role_entry import learner_evaluator
from stare.runtime.process import connect_transport
from stare.sandbox.process import ProcessSandbox
built = []  # every sandbox this process builds (the tool agent builds one and runs check() on it)
init = ProcessSandbox.__init__
ProcessSandbox.__init__ = lambda self, *args, **kwargs: (built.append(1), init(self, *args, **kwargs))[1]
cfg = build_config({"run": {"name": "tool"}, "model": {"path": sys.argv[1]},
                    "task": {"name": "tool-arithmetic", "eval_problems": 4},
                    "rollout": {"tool_use": {"enabled": True}}})
setup = load_run_setup(cfg, lambda m: None)
evaluator = learner_evaluator(cfg, setup, connect_transport(cfg, sys.argv[2]), lambda **info: None)
print(json.dumps({"remote": evaluator.remote, "problems": len(evaluator.problems), "sandboxes": len(built),
                  "imported": sorted(m for m in sys.modules if m.startswith("rollout"))}))
"""


def test_the_learners_evaluator_with_tool_use_builds_no_sandbox_and_imports_no_rollout(tiny_model_dir, tmp_path):
    with redis_server(tmp_path / "redis") as server:
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(tiny_model_dir), server.url],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"remote": True, "problems": 4, "sandboxes": 0, "imported": []}, got
