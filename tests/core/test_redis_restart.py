"""A stream's backlog after Redis is rewritten and killed: a real redis-server, AOF on as the product runs it.

Redis 7.0 replays a delivery from its AOF without advancing the group's `entries-read`, so after an AOF
rewrite (BGREWRITEAOF, or Redis's own as the AOF grows), deliveries, a SIGKILL and a restart, the group's
`lag` counts every entry delivered since the rewrite as unread (stare/transport/redis_backlog.py). The
backlog here is the stream's length (only unacknowledged entries are kept), so it is the same before the
kill and after the restart, counted by hand below."""

from __future__ import annotations

import time

import pytest
import redis
from redis_fixtures import have_redis_server, redis_server
from test_redis_transport import make_stream, traj

from stare.transport.redis_streams import BackpressureError

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not have_redis_server(), reason="needs redis-server on PATH")]

ROUNDS = 100  # publish, deliver, acknowledge after the rewrite: what the group's lag would count as unread


def _rewrite(client) -> None:
    client.bgrewriteaof()
    deadline = time.monotonic() + 30
    while client.info("persistence")["aof_rewrite_in_progress"] or client.info("persistence")["aof_rewrite_scheduled"]:
        assert time.monotonic() < deadline, "BGREWRITEAOF did not finish in 30 s"
        time.sleep(0.05)


def _kill_and_restart(server, fsync: str) -> redis.Redis:
    if fsync == "everysec":
        time.sleep(1.5)  # what everysec has written by now survives; the test is about the rewrite, not that second
    server.kill()  # SIGKILL: only the AOF survives
    server.start()
    return redis.Redis.from_url(server.url, socket_timeout=5, socket_connect_timeout=5)


@pytest.mark.parametrize("fsync", ["always", "everysec"])  # stare up / compose and Kubernetes
def test_the_backlog_survives_an_aof_rewrite_a_sigkill_and_a_restart(tmp_path, fsync):
    with redis_server(tmp_path / "redis", appendfsync=fsync) as server:
        client = redis.Redis.from_url(server.url, socket_timeout=5, socket_connect_timeout=5)
        s = make_stream(client, max_backlog=8, maxlen=16)
        s.publish([traj(i) for i in range(5)])
        s.ack([d.id for d in s.consume("l", 5)])
        _rewrite(client)
        for i in range(5, 5 + ROUNDS):
            s.publish([traj(i)])
            s.ack([d.id for d in s.consume("l", 1)])
        held = s.consume("l", 10) + s.consume("l", 10)  # nothing left to deliver
        assert held == [] and s.backlog() == 0
        client = _kill_and_restart(server, fsync)
        s = make_stream(client, max_backlog=8, maxlen=16)
        assert s.backlog() == 0  # 818deb8: 100 (pending 0 + lag 100), and the publish below refused for good
        s.publish([traj(1000 + i) for i in range(8)])  # a whole max_backlog's worth fits
        with pytest.raises(BackpressureError, match="backlog 8 \\+ 1 new > max_backlog 8"):
            s.publish([traj(2000)])
        client.close()


def test_pending_and_undelivered_entries_are_counted_exactly_after_a_rewrite_and_a_restart(tmp_path):
    with redis_server(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url, socket_timeout=5, socket_connect_timeout=5)
        s = make_stream(client, max_backlog=64, maxlen=128)
        _rewrite(client)
        s.publish([traj(i) for i in range(30)])
        s.ack([d.id for d in s.consume("l", 10)])  # 10 acknowledged
        held = s.consume("l", 7)  # 7 pending
        # 13 never delivered: backlog 7 + 13 = 20
        assert s.backlog() == 20
        client = _kill_and_restart(server, "always")
        s = make_stream(client, max_backlog=64, maxlen=128)
        assert s.backlog() == 20
        assert client.xpending(s.key, "learner")["pending"] == 7
        replayed, new = s.consume("l", 100), s.consume("l", 100)  # its own pending ones first, then the rest
        assert [d.record.trajectory_id for d in replayed + new] == [f"t{i}" for i in range(10, 30)]
        s.ack([d.id for d in held])
        assert s.backlog() == 13  # the replayed 7 acknowledged by id, whoever holds them
        client.close()


def test_a_stream_written_before_acknowledged_entries_were_deleted_counts_only_its_backlog_once_opened(client):
    """A resumed run's stream still holds entries acknowledged by an older stare (XACK without XDEL)."""
    key, group = "stare:r:stream:scored", "learner"
    client.xgroup_create(key, group, id="0", mkstream=True)
    ids = [client.xadd(key, traj(i).to_fields()) for i in range(10)]
    client.xreadgroup(group, "old", {key: ">"}, count=6)
    client.xack(key, group, *ids[:2], *ids[3:6])  # 5 acknowledged; ids[2] pending; 4 never delivered
    s = make_stream(client)
    assert s.backlog() == 1 + 4 + 3  # the 3 acknowledged after the pending one stay counted (bounded; trimmed later)
    assert [e[0] for e in client.xrange(key)][:2] == [ids[2], ids[3]]


def test_a_second_consumer_group_on_a_run_stream_is_refused_naming_it(client):
    client.xgroup_create("stare:r:stream:scored", "spy", id="0", mkstream=True)
    with pytest.raises(ValueError, match="consumer groups \\['spy'\\] besides 'learner'"):
        make_stream(client)


@pytest.fixture
def client(tmp_path):
    with redis_server(tmp_path / "redis") as server:
        c = redis.Redis.from_url(server.url, socket_timeout=5, socket_connect_timeout=5)
        yield c
        c.close()
