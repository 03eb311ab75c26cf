"""A dead learner's aftermath on the weight broadcast (real gloo groups, a real TCPStore per learner, the
learner's death a real process exit where it is the point; a real redis-server for the rendezvous):

* a version is never half-received into an engine: the learner dying mid-version leaves the worker the
  previous whole version (or none), never part of the new one;
* a worker's (epoch, generation) only increases: a newer learner's announcement takes it away from the old
  one's group at once, and the old one (alive but superseded) never reaches it again;
* a worker never joins another run's store, even on the port its own learner announced."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
import redis
import torch
from redis_fixtures import have_redis_server, redis_server

from stare.runtime.net import free_port
from stare.weight_sync.broadcast import BroadcastPublisher, BroadcastSubscriber
from stare.weight_sync.rendezvous import RedisRendezvous

sys.path.insert(0, str(Path(__file__).parents[1]))
from weight_sync_child import state

pytestmark = pytest.mark.slow  # real processes and groups, seconds each

TIMEOUT_S = 3.0
BUCKET = 1024  # bytes: version 2 is ~20 messages, the child dies after 5


def _same(a: Mapping, b: Mapping) -> bool:
    return list(a) == list(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def _copy(s: Mapping) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in s.items()}


def _child(port: int, *redis_args: str) -> subprocess.Popen:
    script = Path(__file__).parents[1] / "weight_sync_child.py"
    return subprocess.Popen(
        [sys.executable, str(script), str(port), str(BUCKET), "5", *redis_args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _line(proc: subprocess.Popen, want: str, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(want):
            return line
        assert line or proc.poll() is None, f"the publisher exited with {proc.returncode} before {want!r}"
    raise AssertionError(f"no {want!r} from the publisher in {timeout_s}s")


@pytest.mark.parametrize("buffer_sets", [2, 1])
def test_a_learner_dying_mid_version_never_hands_the_engine_part_of_it(buffer_sets):
    port = free_port()
    child = _child(port)
    sub = BroadcastSubscriber("127.0.0.1", port, "w0", timeout_s=TIMEOUT_S, poll_s=0.01, buffer_sets=buffer_sets)
    try:
        _line(child, "sent 1")
        assert sub.wait_for(1, 30)
        if buffer_sets == 2:  # the loop holds version 1 while version 2 arrives
            version, held = sub.fetch(0)
            assert version == 1 and _same(held, state(1))
        child.stdin.write("go\n")
        child.stdin.flush()
        _line(child, "dying")
        assert child.wait(timeout=30) == 9
        time.sleep(0.5)  # the worker's pending receives fail on the closed connection
        assert sub.received == 1  # version 2 never completed
        if buffer_sets == 2:
            assert sub.fetch(1) is None and _same(held, state(1))  # the set it held was not written into
        else:  # its one set took part of version 2: version 1 was withdrawn first, nothing is handed out
            assert sub.fetch(0) is None
        pub = BroadcastPublisher("127.0.0.1", port, timeout_s=TIMEOUT_S, communicator="gloo", bucket_bytes=BUCKET)
        try:  # the next learner on the same address: the worker rejoins and gets its version whole
            _wait_join(pub)
            pub.publish(4, state(4))
            assert sub.wait_for(4, 30)
            version, got = sub.fetch(1)
            assert version == 4 and _same(got, state(4))
        finally:
            pub.close()
    finally:
        sub.close()
        child.kill()


def _wait_join(pub: BroadcastPublisher) -> None:
    deadline = time.monotonic() + 30
    while pub.store.add("joins", 0) < 1:
        assert time.monotonic() < deadline, "the worker never asked to join"
        time.sleep(0.01)


@pytest.fixture
def redis_url(tmp_path):
    if not have_redis_server():
        pytest.skip("redis-server is not installed")
    with redis_server(tmp_path / "redis") as server:
        yield server.url


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def _learner(url: str, run: str, port: int = 0) -> BroadcastPublisher:
    return BroadcastPublisher(
        "127.0.0.1",
        port,
        timeout_s=TIMEOUT_S,
        communicator="gloo",
        bucket_bytes=BUCKET,
        rendezvous=RedisRendezvous(_client(url), run),
    )


def _worker(url: str, run: str, name: str) -> BroadcastSubscriber:
    locate = RedisRendezvous(_client(url), run).current
    return BroadcastSubscriber("127.0.0.1", 1, name, timeout_s=TIMEOUT_S, poll_s=0.01, wait_s=0.2, locate=locate)


def test_a_worker_follows_the_newest_learner_and_never_goes_back(redis_url):
    old = _learner(redis_url, "r")
    a, b = _worker(redis_url, "r", "a"), None
    new = None
    try:
        _wait_join(old)
        old.publish(1, state(1))
        b = _worker(redis_url, "r", "b")
        deadline = time.monotonic() + 30
        while old.store.add("joins", 0) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        old.publish(2, state(2))  # generation 2: a stays a member, b joins
        assert a.wait_for(2, 30) and b.wait_for(2, 30)
        assert list(a.joined) == [(1, 1), (1, 2)]
        new = _learner(redis_url, "r")  # a restarted learner: epoch 2, another port, its generations from 1
        assert new.epoch == 2 and new.store.port != old.store.port
        deadline = time.monotonic() + 30
        while new.store.add("joins", 0) < 2:  # both left the old learner's group for the new one
            assert time.monotonic() < deadline, "the workers did not move to the announced learner"
            time.sleep(0.01)
        new.publish(3, state(3))
        assert a.wait_for(3, 30) and b.wait_for(3, 30)
        old.publish(9, state(9))  # the superseded learner, still alive: reaches nobody
        time.sleep(1.0)
        for w in (a, b):
            version, got = w.fetch(2)
            assert version == 3 and _same(got, state(3)) and w.fetch(3) is None
            assert w.joined[-1][0] == 2 and list(w.joined) == sorted(set(w.joined))  # only ever increasing
    finally:
        for x in (a, b, old, new):
            if x is not None:
                x.close()


def test_a_worker_never_joins_another_runs_store_on_its_learners_port(redis_url):
    ours = _learner(redis_url, "ours")
    port = ours.store.port
    ours.close()
    del ours  # our learner is gone; its announcement (this port, epoch 1) is still in Redis
    import gc

    gc.collect()
    other = _learner(redis_url, "other", port)  # another run's learner takes the port
    w = _worker(redis_url, "ours", "w")
    restarted = None
    try:
        time.sleep(1.5)
        assert other.store.add("joins", 0) == 0 and list(w.joined) == []  # it did not ask to join
        other.publish(1, state(1))
        assert not w.wait_for(1, 1.0)
        restarted = _learner(redis_url, "ours")  # our learner again: epoch 2, wherever it binds
        _wait_join(restarted)
        restarted.publish(5, state(5))
        assert w.wait_for(5, 30) and _same(w.fetch(0)[1], state(5)) and list(w.joined) == [(2, 1)]
    finally:
        w.close()
        other.close()
        if restarted is not None:
            restarted.close()
