"""Health that matches long work: `RoleRuntime.busy` keeps a role healthy while its busy thread
makes progress (uses CPU) and reports a hung one after `system.stall_s`; a real `stare learner`
process stays healthy while it waits for an evaluation (sampled and scored by other processes,
here none: it ends at `task.eval_timeout_s`) several times longer than `stall_s`. Real
redis-server, real HTTP /healthz."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from redis_fixtures import free_port, have_redis_server, redis_server

from learner.engine.deepspeed_engine import child_env
from stare.config import build_config
from stare.runtime.process import RoleRuntime

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed")]

STALL_S = 1.0
LEARNER_STALL_S = 0.5  # the learner's evaluation must last several of these on any machine


def _health(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _burn_cpu(seconds: float) -> None:
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += sum(range(1000))


@pytest.mark.parametrize(
    "work, healthy",
    [(_burn_cpu, True), (lambda s: threading.Event().wait(s), False)],
    ids=["alive-evaluation", "hung-evaluation"],
)
def test_a_busy_role_is_healthy_while_its_thread_progresses_and_reported_when_it_hangs(tmp_path: Path, work, healthy):
    port = free_port()
    cfg = build_config(
        {"run": {"name": "health"}, "system": {"stall_s": STALL_S, "heartbeat_s": 0.2, "health_port": port}}
    )
    seen = []
    with redis_server(tmp_path) as server, RoleRuntime("learner", "learner", cfg, server.url) as rt:

        def probe():
            while not done.is_set():
                seen.append(_health(port))
                time.sleep(0.2)

        done = threading.Event()
        prober = threading.Thread(target=probe)
        prober.start()
        with rt.busy("evaluating"):
            work(4 * STALL_S)
            during = len(seen)  # the probes taken while busy (the prober goes on a moment after)
        after = _health(port)
        done.set()
        prober.join(timeout=10)
    late = seen[during // 2 : during]  # well past stall_s into the work
    assert late and all(body["busy"] == "evaluating" for _, body in late)
    assert all(code == (200 if healthy else 503) for code, _ in late), seen
    assert after[0] == 200 and after[1]["busy"] is None  # done: the loop ticks again


@pytest.mark.slow
def test_a_learner_process_stays_healthy_while_it_waits_for_an_evaluation_longer_than_stall_s(
    tiny_model_dir, tmp_path: Path
):
    port = free_port()
    cfg = {
        "run": {"name": "health", "output_dir": str(tmp_path / "runs"), "threads": 1},
        "model": {"path": str(tiny_model_dir)},
        "task": {"eval_problems": 4, "eval_k": 2, "eval_timeout_s": 8 * LEARNER_STALL_S},
        "rollout": {"max_new_tokens": 32},
        "system": {"stall_s": LEARNER_STALL_S, "heartbeat_s": 0.1, "health_port": port, "broadcast_port": free_port()},
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    eval_file = tmp_path / "runs" / "health" / "eval.jsonl"
    with redis_server(tmp_path / "redis") as server:
        # without this process's process-group variables (an in-process run earlier holds its MASTER_PORT)
        env = {**child_env(), "STARE_REDIS_URL": server.url, "TORCH_CPP_LOG_LEVEL": "ERROR"}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from stare.app.cli import main; main()",
                "learner",
                "--config",
                str(tmp_path / "cfg.yaml"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        seen, evaluating_since, deadline = [], None, time.monotonic() + 300
        try:
            while not eval_file.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    pytest.fail(f"the learner died or never evaluated:\n{proc.communicate(timeout=60)[0][-4000:]}")
                try:
                    code, body = _health(port)
                except OSError:  # not serving yet
                    time.sleep(0.1)
                    continue
                seen.append((code, body))
                if body["busy"] == "evaluating" and evaluating_since is None:
                    evaluating_since = time.monotonic()
                time.sleep(0.1)
            evaluated_s = time.monotonic() - evaluating_since
        finally:
            proc.terminate()
            out = proc.communicate(timeout=60)[0]
    assert evaluated_s > 3 * LEARNER_STALL_S, f"the evaluation took {evaluated_s:.1f}s: too short to show anything"
    during = [code for code, body in seen if body["busy"] == "evaluating"]
    assert len(during) >= 10 and set(during) == {200}, (during, out[-3000:])
    row = json.loads(eval_file.read_text().splitlines()[0])
    assert (row["step"], row["complete"], row["missing_samples"]) == (0, False, 4 * (1 + 2))
    assert "12 of 12 samples missing" in out  # the log says what was missing
