"""`stare up` survives its redis-server killed after an AOF rewrite (a real redis-server, every role a process).

Redis 7.0 replays deliveries from its AOF without advancing a group's entries-read, so after a rewrite,
a SIGKILL and a restart the group's `lag` counted every record delivered since the rewrite as unread: with
the stream bounds below (65 records), the rollout's and the reward worker's publishes were refused for
good after the restart and the run stalled while every role reported itself alive. The launcher restarts
its redis-server by itself; the run must finish with every step trained once, no trajectory trained
twice and no published group lost (stare.observe.lineage)."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis
from redis_fixtures import have_redis_server
from test_up import PROMPTS, SAMPLES, Run, _config

from stare.observe.lineage import read_lineage

pytestmark = [
    pytest.mark.slow,
    pytest.mark.redis,
    pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed"),
]

STEPS, KILL_AT = 10, 6


def _rewrite(client) -> None:
    client.bgrewriteaof()
    deadline = time.monotonic() + 30
    while (info := client.info("persistence"))["aof_rewrite_in_progress"] or info["aof_rewrite_scheduled"]:
        assert time.monotonic() < deadline, "BGREWRITEAOF did not finish in 30 s"
        time.sleep(0.05)


def test_a_run_finishes_exactly_after_redis_is_killed_following_an_aof_rewrite(tiny_model_dir, tmp_path):
    # stream bound: max_backlog 1 + (checkpoint_every 1 + staleness 1 + 2) x 16 rows = 65 records,
    # crossed by the raw and scored streams within the 5 steps between the rewrite and the kill
    cfg = _config(tiny_model_dir, tmp_path, STEPS, run__checkpoint_every=1, system__max_backlog=1)
    with Run(cfg, rollout=1, reward=1, control=False) as run:
        client = redis.Redis.from_url(run.launcher.redis_url, socket_timeout=10)
        run.wait_for_step(1)
        _rewrite(client)
        run.wait_for_step(KILL_AT)
        pid = client.info("server")["process_id"]
        client.close()
        os.kill(pid, signal.SIGKILL)  # as from outside; the launcher starts it again from its AOF
        run.wait_finished(timeout_s=150)
        assert run.launcher.redis_restarts == 1 and run.launcher.redis.proc.pid != pid
        assert "restarting it on port" in run.log.getvalue()
        restarts = {name: r.restarts for name, r in run.launcher.roles.items()}
        assert restarts == dict.fromkeys(restarts, 0), f"roles died instead of reconnecting: {restarts}"
    run.launcher.redis.start()  # the stopped run's redis-server, from its AOF
    try:
        client = redis.Redis.from_url(run.launcher.redis_url, socket_timeout=10)
        lineage = read_lineage(run.dir, client)
        client.close()
    finally:
        run.launcher.redis.kill()
    assert lineage.problems(STEPS, PROMPTS * SAMPLES) == [], run.tail(200)
    print("lineage:", lineage.summary())
