"""`stare up` survives its redis-server killed after an AOF rewrite, and trains no forged record (a real
redis-server, every role a process).

Redis 7.0 replays deliveries from its AOF without advancing a group's entries-read, so after a rewrite,
a SIGKILL and a restart the group's `lag` counted every record delivered since the rewrite as unread: with
the stream bounds below (65 records), the rollout's and the reward worker's publishes were refused for
good after the restart and the run stalled while every role reported itself alive. The launcher restarts
its redis-server by itself; the run must finish with every step trained once, no trajectory trained
twice and no published group lost (stare.observe.lineage).

Mid-run, 12 well-formed trajectories (3 complete groups) are written to the scored stream with the Redis
password alone, as anyone holding it could: 818deb8 trained them; now they fail their tag, are
dead-lettered with the reason and never trained (stare.transport.record_tag)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
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

STEPS, KILL_AT = 14, 6  # 8 steps between the kill and the end: a fast machine does not finish first


def _rewrite(client) -> None:
    client.bgrewriteaof()
    deadline = time.monotonic() + 30
    while (info := client.info("persistence"))["aof_rewrite_in_progress"] or info["aof_rewrite_scheduled"]:
        assert time.monotonic() < deadline, "BGREWRITEAOF did not finish in 30 s"
        time.sleep(0.05)


def _forged(run_id: str) -> list:
    from stare.transport.records import Trajectory

    return [
        Trajectory(
            run_id=run_id,
            trajectory_id=f"g{900_000 + g:09d}:{j}",
            group_id=f"g{900_000 + g:09d}",
            group_size=SAMPLES,
            weight_version=1,
            prompt_token_ids=np.array([5, 6, 7], np.int32),
            response_token_ids=np.array([8, 9], np.int32),
            response_logprobs=np.array([-0.1, -0.2], np.float32),
            loss_mask=np.ones(2, np.uint8),
            finish_reason="stop",
            answer="1",
            problem_id="forged",
            data_source="forged",
            reward=float(j % 2),
        )
        for g in range(3)
        for j in range(SAMPLES)
    ]


def test_a_run_finishes_exactly_after_redis_is_killed_following_an_aof_rewrite(tiny_model_dir, tmp_path):
    # stream bound: max_backlog 1 + (checkpoint_every 1 + staleness 1 + 2) x 16 rows = 65 records,
    # crossed by the raw and scored streams within the 5 steps between the rewrite and the kill
    cfg = _config(tiny_model_dir, tmp_path, STEPS, run__checkpoint_every=1, system__max_backlog=1)
    with Run(cfg, rollout=1, reward=1, control=False) as run:
        client = redis.Redis.from_url(run.launcher.redis_url, socket_timeout=10)
        run.wait_for_step(1)
        for record in _forged(cfg.run.name):
            client.xadd(f"stare:{cfg.run.name}:stream:scored", record.to_fields())
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
        dead = client.xrange(f"stare:{cfg.run.name}:dead:scored")
        untrusted = sum(f[b"reason"].startswith(b"UntrustedRecord: ") for _, f in dead)
        client.close()
    finally:
        run.launcher.redis.kill()
    assert lineage.problems(STEPS, PROMPTS * SAMPLES) == [], run.tail(200)  # a forged group would be "never published"
    assert not any(i.startswith("g0009") for i in lineage.trained_ids)
    assert untrusted == 12
    print("lineage:", lineage.summary())
