"""Fixtures of the control-plane tests: both RunState implementations (Redis on a real
redis-server), a controller published the way the learner does it, and in-process app clients."""

from __future__ import annotations

import pytest
from redis_fixtures import have_redis_server, redis_server

from learner.algorithm.entropy_controller import EntropyController
from stare.config.algo import ControllerConfig
from stare.runstate import MemoryRunState


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    if not have_redis_server():
        pytest.skip("redis-server is not on PATH (apt-get install redis-server)")
    with redis_server(tmp_path_factory.mktemp("redis-control"), appendfsync="everysec") as server:
        yield server.url


@pytest.fixture
def redis_state_factory(redis_url, request):
    from stare.runstate.redis_state import RedisRunState

    made = []

    def make(**options):
        state = RedisRunState.connect(redis_url, f"t{len(made)}-{abs(hash(request.node.nodeid)) % 10**8}", **options)
        state.client.delete(*(state.client.keys(f"stare:{state.run_id}:*") or ["-"]))
        made.append(state)
        return state

    yield make
    for state in made:
        state.close()


@pytest.fixture(params=["memory", "redis"])
def make_state(request):
    """A factory of empty RunStates of either implementation: make_state(**options)."""
    if request.param == "memory":
        return lambda **options: MemoryRunState("run", **options)
    return request.getfixturevalue("redis_state_factory")


@pytest.fixture
def controller():
    return EntropyController(ControllerConfig(target=0.3))
