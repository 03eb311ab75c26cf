"""The Redis-stream transport against a real redis-server (AOF on), one property per test."""

import threading
import time

import numpy as np
import pytest
import redis
from redis_fixtures import have_redis_server, redis_server

from stare.transport.records import SCHEMA_VERSION, PromptTask, Trajectory
from stare.transport.redis_streams import BackpressureError, RedisStream
from stare.transport.redis_transport import RedisTransport

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not have_redis_server(), reason="needs redis-server on PATH")]


@pytest.fixture
def server(tmp_path):
    with redis_server(tmp_path / "redis") as s:
        yield s


@pytest.fixture
def client(server):
    c = redis.Redis.from_url(server.url, socket_timeout=5, socket_connect_timeout=5)
    yield c
    c.close()


def make_stream(client, *, run_id="r", name="scored", codec=Trajectory, **options) -> RedisStream:
    options = {"group": "learner", "backoff_s": 0.02, **options}
    return RedisStream(client, run_id, name, codec, **options)


def traj(i: int, n: int = 16, seed: int = 0) -> Trajectory:
    rng = np.random.default_rng(seed + i)
    return Trajectory(
        run_id="r",
        trajectory_id=f"t{i}",
        group_id=f"g{i // 4}",
        group_size=4,
        weight_version=i,
        prompt_token_ids=rng.integers(0, 150_000, 7, dtype=np.int32),
        response_token_ids=rng.integers(0, 150_000, n, dtype=np.int32),
        response_logprobs=-rng.exponential(1.0, n).astype(np.float32),
        loss_mask=(rng.random(n) > 0.2).astype(np.uint8),
        finish_reason="stop",
        answer="42",
        problem_id=f"p{i}",
        data_source="d",
        response_text="héllo",
        reward=0.5,
        reward_info={"correct": False, "why": [1, 2]},
    )


def ids_of(deliveries) -> list[str]:
    return [d.record.trajectory_id for d in deliveries]


def test_trajectories_round_trip_with_exact_arrays(client):
    s = make_stream(client)
    sent = [traj(0, n=1000), traj(1, n=3)]
    s.publish(sent)
    got = [d.record for d in s.consume("l", 10)]
    assert len(got) == 2
    for a, b in zip(sent, got):
        for name in ("prompt_token_ids", "response_token_ids", "response_logprobs", "loss_mask"):
            x, y = getattr(a, name), getattr(b, name)
            assert y.dtype == x.dtype and np.array_equal(x, y), name  # bit-exact, float32 included
        assert (b.trajectory_id, b.weight_version, b.reward, b.reward_info, b.response_text) == (
            a.trajectory_id,
            a.weight_version,
            a.reward,
            a.reward_info,
            a.response_text,
        )


def test_unacked_entry_is_redelivered_to_the_same_consumer_after_restart(client):
    s = make_stream(client)
    s.publish([traj(0), traj(1), traj(2)])
    first = s.consume("learner-0", 2)
    s.ack([first[0].id])  # t1 stays pending; the process "dies"
    restarted = make_stream(client)
    assert ids_of(restarted.consume("learner-0", 10)) == ["t1"]  # its own pending entry first (id "0")
    assert ids_of(restarted.consume("learner-0", 10)) == ["t2"]  # then new ones (">"), t1 not again


def test_reclaim_hands_a_dead_consumers_pending_entries_to_another(client):
    dead, live = make_stream(client), make_stream(client)  # two processes
    dead.publish([traj(i) for i in range(3)])
    assert len(dead.consume("dead", 10)) == 3
    assert live.reclaim("live", min_idle_ms=60_000) == []  # not idle long enough yet
    time.sleep(0.05)
    got = live.reclaim("live", min_idle_ms=20)
    assert ids_of(got) == ["t0", "t1", "t2"]
    pending = client.xpending_range(live.key, "learner", "-", "+", 10)
    assert {p["consumer"] for p in pending} == {b"live"}
    assert (live.redelivered, dead.redelivered) == (3, 0)  # the count the role reports to Prometheus
    assert live.reclaim("live", min_idle_ms=20) == [] and live.redelivered == 3  # its own in-flight ones: not again


def test_malformed_entries_are_dead_lettered_with_reason_and_good_ones_flow(client):
    s = make_stream(client)
    s.publish([traj(0)])
    garbage_id = client.xadd(s.key, {"foo": b"\x00\xff"}).decode()
    wrong = traj(1).to_fields()
    wrong["json"] = wrong["json"].replace(f'"schema": {SCHEMA_VERSION}'.encode(), b'"schema": 99')
    wrong_id = client.xadd(s.key, wrong).decode()
    s.publish([traj(2)])
    assert ids_of(s.consume("l", 10)) == ["t0", "t2"]
    dead = {d.entry_id: d for d in s.dead_letters()}
    assert set(dead) == {garbage_id, wrong_id}
    assert "missing field 'json'" in dead[garbage_id].reason and dead[garbage_id].raw == {"foo": b"\x00\xff"}
    assert "schema is 99" in dead[wrong_id].reason and dead[wrong_id].raw == wrong
    assert s.dead_letter_count() == 2
    assert s.backlog() == 2  # the dead ones are acked, the good ones pending


def test_publish_and_ack_lands_outputs_and_acks_inputs_in_one_transaction(server, client):
    prompts = make_stream(client, name="prompts", codec=Trajectory, group="rollout")
    raw = make_stream(client, name="raw")
    prompts.publish([traj(i) for i in range(3)])
    taken = prompts.consume("rollout-0", 3)
    watcher = redis.Redis.from_url(server.url, socket_timeout=5, socket_connect_timeout=5)
    with watcher.monitor() as monitor:  # what Redis executes, in order
        ids = raw.publish_and_ack([traj(10), traj(11)], prompts, [d.id for d in taken])
        seen = []
        while not seen or seen[-1] != "EXEC":
            seen.append(monitor.next_command()["command"].split()[0].upper())
    watcher.close()
    assert seen[seen.index("MULTI") :] == ["MULTI", "XADD", "XADD", "XLEN", "XACK", "XDEL", "EXEC"]  # one transaction
    assert ids_of(raw.consume("l", 10)) == ["t10", "t11"] and len(ids) == 2
    assert prompts.backlog() == 0  # every input acknowledged


def test_publish_and_ack_on_another_client_publishes_then_acks(server, client):
    other = redis.Redis.from_url(server.url, socket_timeout=5, socket_connect_timeout=5)
    prompts = make_stream(other, name="prompts", codec=Trajectory, group="rollout")
    raw = make_stream(client, name="raw")
    prompts.publish([traj(0)])
    taken = prompts.consume("rollout-0", 1)
    raw.publish_and_ack([traj(1)], prompts, [taken[0].id])
    assert ids_of(raw.consume("l", 10)) == ["t1"] and prompts.backlog() == 0
    other.close()


def test_backlog_counts_pending_and_undelivered_entries(client):
    s = make_stream(client)
    s.publish([traj(i) for i in range(5)])
    assert s.backlog() == 5
    got = s.consume("l", 2)
    assert s.backlog() == 5  # delivered, not acked
    s.ack([d.id for d in got])
    assert s.backlog() == 3
    s.ack([d.id for d in s.consume("l", 10)])
    assert s.backlog() == 0


def test_an_acknowledged_entry_leaves_the_stream_so_its_length_is_the_backlog(client):
    s = make_stream(client, max_backlog=5, maxlen=10)
    ids = s.publish([traj(i) for i in range(4)])
    s.ack([d.id for d in s.consume("l", 1)])
    s.dead_letter(s.consume("l", 1)[0].id, {"why": "test"}, "parked")  # parked: acknowledged too
    assert [e[0].decode() for e in client.xrange(s.key)] == ids[2:]  # the 2 never delivered, nothing else
    assert s.backlog() == 2
    s.publish([traj(4), traj(5), traj(6)])
    with pytest.raises(BackpressureError, match="backlog 5 "):
        s.publish([traj(7)])


def test_publish_past_max_backlog_is_refused_without_writing(client):
    s = make_stream(client, max_backlog=4, maxlen=8)
    s.publish([traj(i) for i in range(3)])
    with pytest.raises(BackpressureError, match="backlog 3 \\+ 2 new > max_backlog 4"):
        s.publish([traj(3), traj(4)])
    assert client.xlen(s.key) == 3  # all or nothing
    s.publish([traj(3)])  # exactly at the bound is fine
    assert s.backlog() == 4


def test_a_producer_counts_other_producers_writes_seen_at_its_last_publish(client):
    """Two producers on one stream: each publish reads the backlog back in its own round trip, so
    a producer that raced another overshoots by at most its one batch and is then refused."""
    a, b = make_stream(client, max_backlog=6, maxlen=12), make_stream(client, max_backlog=6, maxlen=12)
    a.publish([traj(0), traj(1)])
    b.publish([traj(2), traj(3), traj(4)])
    a.publish([traj(5), traj(6)])  # a last saw 2: goes ahead and overshoots to 7, seeing 7
    with pytest.raises(BackpressureError, match="backlog 7 "):
        a.publish([traj(7)])
    assert a.backlog() == 7


def test_blocking_publish_waits_for_consumers_to_ack(client):
    s = make_stream(client, max_backlog=2, maxlen=4, publish_timeout_s=5.0)
    s.publish([traj(0), traj(1)])
    consumer = make_stream(client)

    def drain():
        time.sleep(0.2)
        consumer.ack([d.id for d in consumer.consume("l", 1)])

    t = threading.Thread(target=drain)
    t.start()
    start = time.monotonic()
    s.publish([traj(2)])
    t.join()
    assert 0.15 < time.monotonic() - start < 3.0 and s.backlog() == 2


def test_keys_are_run_scoped(server):
    a = RedisTransport.connect(server.url, "run-a", block_ms=100)
    b = RedisTransport.connect(server.url, "run-b", block_ms=100)
    task = PromptTask(
        run_id="run-a",
        group_id="g",
        prompt="1+1=",
        prompt_token_ids=[1],
        answer="2",
        problem_id="p",
        data_source="d",
        group_size=4,
    )
    a.prompts.publish([task])
    assert a.prompts.key == "stare:run-a:stream:prompts" and a.raw.dead_key == "stare:run-a:dead:raw"
    assert b.prompts.consume("w", 10) == [] and b.prompts.backlog() == 0
    assert [d.record for d in a.prompts.consume("w", 10)] == [task]
    a.close(), b.close()


def test_survives_a_redis_restart_with_pending_entries_kept(server, client):
    s = make_stream(client, retries=8)
    s.publish([traj(i) for i in range(3)])
    held = s.consume("l", 2)
    server.kill()  # SIGKILL: only the AOF survives
    restarter = threading.Timer(0.3, server.start)
    restarter.start()
    assert s.backlog() == 3  # retries with backoff until Redis is back
    restarter.join()
    assert client.xpending(s.key, "learner")["pending"] == 2
    assert ids_of(make_stream(client).consume("l", 10)) == ["t0", "t1"]  # a restarted process gets them
    assert ids_of(s.consume("l", 10)) == ["t2"]  # this one's replay skips what it still holds
    s.ack([d.id for d in held])
    assert s.backlog() == 1


def test_reconnect_attempts_are_bounded(server, client):
    s = make_stream(client, retries=3, backoff_s=0.01)
    server.kill()
    start = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        s.backlog()
    assert time.monotonic() - start < 2.0


def test_no_entry_is_delivered_to_two_consumers_of_one_group(client):
    a, b = make_stream(client), make_stream(client)
    a.publish([traj(i) for i in range(20)])
    got_a, got_b = [], []
    while True:
        batch_a, batch_b = a.consume("a", 3), b.consume("b", 3)
        if not batch_a and not batch_b:
            break
        got_a += ids_of(batch_a)
        got_b += ids_of(batch_b)
    assert sorted(got_a + got_b) == sorted(f"t{i}" for i in range(20))  # each exactly once
    assert got_a and got_b


def test_entry_that_keeps_killing_consumers_is_dead_lettered(client):
    s = make_stream(client, max_deliveries=2)
    s.publish([traj(0)])
    entry = s.consume("c1", 1)[0].id  # delivery 1; c1 dies
    assert ids_of(make_stream(client, max_deliveries=2).reclaim("c2", min_idle_ms=0)) == ["t0"]  # delivery 2; dies
    assert make_stream(client, max_deliveries=2).reclaim("c3", min_idle_ms=0) == []
    (dead,) = s.dead_letters()
    assert dead.entry_id == entry and "max_deliveries=2" in dead.reason and s.backlog() == 0


def test_blocking_consume_returns_within_block_ms(client):
    s = make_stream(client, block_ms=150)
    start = time.monotonic()
    assert s.consume("l", 1, block_s=30.0) == []
    assert 0.1 < time.monotonic() - start < 1.5


def test_client_without_socket_timeout_is_rejected():
    with pytest.raises(ValueError, match="socket_timeout"):
        RedisStream(redis.Redis(socket_timeout=None), "r", "scored", Trajectory, group="learner")


def test_a_stream_whose_keys_vanished_recreates_its_group(client):
    s = make_stream(client)
    s.publish([traj(0)])
    client.flushall()  # what a restart without persistence leaves
    s.publish([traj(1)])
    assert ids_of(s.consume("l", 10)) == ["t1"] and s.backlog() == 1


def test_the_roles_run_unchanged_on_redis_streams(server):
    from learner.loop.group_collector import GroupCollector
    from reward.worker import RewardWorker
    from stare.data.tasks.registry import build_task

    t = RedisTransport.connect(server.url, "roles", block_ms=100)
    bad = traj(3)
    bad.loss_mask = bad.loss_mask[:2]  # breaks an invariant: parked when decoded, never scored
    t.raw.publish([traj(0), traj(1), traj(2), bad, traj(1)])  # t1 twice: a redelivered duplicate
    RewardWorker(build_task("arithmetic"), t.raw, t.scored, name="reward-0").run_once()
    collector = GroupCollector(t.scored, name="learner-0", dynamic_sampling=False)
    collector.pull(learner_version=10)
    assert [d.entry_id for d in t.raw.dead_letters()] and "loss_mask" in t.raw.dead_letters()[0].reason
    assert collector.stats.duplicates == 1 and sorted(collector.partial["g0"]) == ["t0", "t1", "t2"]
    assert t.raw.backlog() == 0 and t.scored.backlog() == 3  # held by the learner until its group is complete
    t.close()
