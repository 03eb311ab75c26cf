"""Weight sync backends: the run-time broadcast group and the shared-folder backend."""

from __future__ import annotations

import time

import pytest
import redis
import torch
from broadcast_helpers import TIMEOUT_S
from broadcast_helpers import await_join_request as _await_join_request
from broadcast_helpers import subscriber as _subscriber
from redis_fixtures import have_redis_server, redis_server

from stare.runtime.net import free_port
from stare.weight_sync.broadcast import BroadcastPublisher
from stare.weight_sync.filesystem import FilesystemPublisher, FilesystemSubscriber


def _state(shift: float) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(7, 5, generator=g) + shift,
        "layer.bias": torch.arange(3, dtype=torch.float32) + shift,
        "half.weight": (torch.randn(4, 2, generator=g) + shift).to(torch.bfloat16),
    }


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


@pytest.fixture
def publisher():
    pub = BroadcastPublisher("127.0.0.1", free_port(), timeout_s=TIMEOUT_S)
    yield pub
    pub.close()


def test_a_worker_receives_every_published_version_bit_exact(publisher):
    sub = _subscriber(publisher, "w0")
    try:
        _await_join_request(publisher, 1)
        for version in (1, 2, 3):
            publisher.publish(version, _state(version))
            assert sub.wait_for(version, 10)
            got_version, got = sub.fetch(version - 1)
            assert got_version == version and _same(got, _state(version))
    finally:
        sub.close()


def test_a_worker_joining_between_steps_gets_the_next_version_and_members_stay(publisher):
    first = _subscriber(publisher, "w0")
    try:
        _await_join_request(publisher, 1)
        publisher.publish(1, _state(1))
        second = _subscriber(publisher, "w1")
        _await_join_request(publisher, 2)
        publisher.publish(2, _state(2))
        assert first.wait_for(2, 10) and second.wait_for(2, 10)
        assert publisher.members == ["w0", "w1"] and _same(second.fetch(0)[1], _state(2))
        second.close()
    finally:
        first.close()


def test_serve_joiners_sends_the_current_weights_to_a_new_worker_without_a_new_version(publisher):
    publisher.publish(4, _state(4))  # nobody there yet
    sub = _subscriber(publisher, "late")
    try:
        _await_join_request(publisher, 1)
        assert publisher.serve_joiners(4, lambda: _state(4))
        assert sub.wait_for(4, 10) and _same(sub.fetch(0)[1], _state(4))
        assert publisher.serve_joiners(4, lambda: _state(4)) is False  # nobody new: nothing built or sent
    finally:
        sub.close()


def test_a_dead_worker_misses_the_version_but_the_others_get_it_and_it_rejoins_when_back(publisher):
    alive, doomed = _subscriber(publisher, "alive"), _subscriber(publisher, "doomed")
    try:
        _await_join_request(publisher, 2)
        publisher.publish(1, _state(1))
        assert alive.wait_for(1, 10) and doomed.wait_for(1, 10)
        doomed.close()  # stops receiving: its sends fail, the survivor's do not
        t0 = time.monotonic()
        publisher.publish(2, _state(2))
        assert time.monotonic() - t0 < TIMEOUT_S + 2.0 and publisher.failures == 1
        assert publisher.alive_members == ["alive"] and alive.wait_for(2, 10) and _same(alive.fetch(1)[1], _state(2))
        publisher.publish(3, _state(3))  # the lost member is skipped: no second failure
        assert alive.wait_for(3, 10) and publisher.failures == 1
        back = _subscriber(publisher, "doomed")  # restarted under the same name
        try:
            _await_join_request(publisher, 3)
            publisher.publish(4, _state(4))  # a new generation: the survivor and the one back
            assert back.wait_for(4, 10) and alive.wait_for(4, 10) and publisher.members == ["alive", "doomed"]
        finally:
            back.close()
    finally:
        alive.close()


def test_a_worker_restarted_before_the_learner_noticed_gets_the_next_version(publisher):
    first = _subscriber(publisher, "w")
    _await_join_request(publisher, 1)
    publisher.publish(1, _state(1))
    assert first.wait_for(1, 10)
    first.close()  # the process dies, and its successor asks to join before any send to it failed
    again = _subscriber(publisher, "w")
    try:
        _await_join_request(publisher, 2)
        t0 = time.monotonic()
        publisher.publish(2, _state(2))  # a new generation with the new process, not a send to the old one
        assert time.monotonic() - t0 < TIMEOUT_S and publisher.failures == 0 and publisher.members == ["w"]
        assert again.wait_for(2, 10) and _same(again.fetch(0)[1], _state(2))
    finally:
        again.close()


def test_version_must_increase(publisher):
    publisher.publish(1, _state(1))
    with pytest.raises(ValueError, match="must increase"):
        publisher.publish(1, _state(1))


def needs_redis(test):
    return pytest.mark.redis(pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed")(test))


@needs_redis
def test_filesystem_backend_hands_over_the_newest_version_and_keeps_only_the_last_few(tmp_path):
    with redis_server(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        pub = FilesystemPublisher(client, "run1", tmp_path / "weights", keep=2)
        sub = FilesystemSubscriber(client, "run1", poll_s=0.01)
        assert sub.fetch(-1) is None and not sub.wait_for(0, 0.05)
        for version in (1, 2, 3):
            pub.publish(version, _state(version))
        version, state = sub.fetch(0)  # a worker that missed 1 and 2 jumps to 3
        assert version == 3 and _same(state, _state(3)) and sub.fetch(3) is None
        assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v00000002", "v00000003"]


@needs_redis
def test_filesystem_backend_saves_tied_weights(tmp_path):
    with redis_server(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        shared = torch.randn(4, 3)
        FilesystemPublisher(client, "run1", tmp_path / "weights").publish(1, {"embed": shared, "lm_head": shared})
        _, state = FilesystemSubscriber(client, "run1").fetch(0)
        assert torch.equal(state["embed"], shared) and torch.equal(state["lm_head"], shared)
