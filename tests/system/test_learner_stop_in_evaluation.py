"""`stare learner` stopped (SIGTERM) while it waits for a held-out evaluation the rollout and reward workers
have not sampled: it ends the wait at once (not after task.eval_timeout_s), says so, exits 0 and leaves the
evaluation open in the run's index for the next learner to collect (a real redis-server, the learner in its
own process, no workers)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import redis
import yaml
from redis_fixtures import have_redis_server, redis_server
from test_up import _config

from stare.evaluation.streams import RedisEvalIndex

pytestmark = [
    pytest.mark.slow,
    pytest.mark.redis,
    pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed"),
]


def test_a_sigterm_during_an_evaluation_wait_stops_the_learner_at_once_and_leaves_it_open(tiny_model_dir, tmp_path):
    from learner.engine.deepspeed_engine import child_env

    cfg = _config(tiny_model_dir, tmp_path / "runs", 4, task__eval_every=1, task__eval_timeout_s=900.0)
    path = tmp_path / "learner.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    with redis_server(tmp_path / "redis") as server:
        index = RedisEvalIndex(redis.Redis.from_url(server.url, socket_timeout=10), cfg.run.name)
        argv = [sys.executable, "-m", "stare.app.cli", "learner", "--config", str(path), "--redis-url", server.url]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env())
        try:
            deadline = time.monotonic() + 240
            while not index.open_ids():  # the step-0 evaluation published: the learner waits for its samples
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                time.sleep(0.2)
            time.sleep(1.0)  # well inside the wait
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=120)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
        states = {e: index.published(e)["state"] for e in index.open_ids()}
    assert proc.returncode == 0, out
    assert took < 60, f"the learner took {took:.0f} s to stop"  # not task.eval_timeout_s (900 s)
    assert "evaluation v0: a stop was requested while waiting (0 of 12 samples in)" in out, out
    assert states == {"v0": "open"}  # left for the next learner
