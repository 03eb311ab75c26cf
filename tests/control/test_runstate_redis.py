"""What only the Redis store has to show: run-scoped keys, surviving a Redis restart, and a clear
error once the retry budget is spent."""

from __future__ import annotations

import threading
import time

import pytest
from redis_fixtures import free_port, have_redis_server, redis_server

from stare.runstate import RunStateUnavailable
from stare.runstate.redis_state import RedisRunState

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not have_redis_server(), reason="redis-server is not on PATH")]


def test_keys_are_scoped_by_run_id(redis_state_factory):
    a, b = redis_state_factory(), redis_state_factory()
    a.set_status({"phase": "training"})
    assert b.status() is None
    assert all(k.startswith(f"stare:{a.run_id}:") for k in a.client.keys(f"*{a.run_id}*"))


def test_a_call_during_a_redis_restart_is_retried_and_succeeds(tmp_path):
    with redis_server(tmp_path / "r") as server:
        state = RedisRunState.connect(server.url, "run", socket_timeout_s=1.0)
        state.set_status({"step": 1})
        server.kill()
        restarter = threading.Timer(0.5, server.start)
        restarter.start()
        state.set_status({"step": 2})  # retried with backoff until Redis is back
        restarter.join()
        assert state.status() == {"step": 2}


def test_an_unreachable_redis_raises_run_state_unavailable_within_the_budget():
    state = RedisRunState.connect(
        f"redis://127.0.0.1:{free_port()}/0", "run", socket_timeout_s=0.5, retries=3, op_timeout_s=2.0
    )
    t0 = time.monotonic()
    with pytest.raises(RunStateUnavailable, match="unavailable during GET status"):
        state.status()
    assert time.monotonic() - t0 < 3.0
    assert state.ping() is False


def test_a_client_without_socket_timeout_is_refused(redis_url):
    import redis

    with pytest.raises(ValueError, match="socket_timeout"):
        RedisRunState(redis.Redis.from_url(redis_url), "run")
