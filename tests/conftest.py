import sys
from pathlib import Path

# Test helper modules (algo_helpers.py) import as top-level modules.
sys.path.insert(0, str(Path(__file__).parent))

import os

import pytest
from train_helpers import fast_override_list

LAUNCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def no_launch_env():
    """Each test starts without the launch variables: an in-process learner (of an earlier test, or a
    module's fixture) sets them for its one-process group (learner.engine.deepspeed_engine.init_distributed),
    and a `stare` subprocess would otherwise inherit that group's port, still listening in this process.
    A learner made in process later wraps the group that exists. Restored after the test."""
    before = {k: os.environ.pop(k) for k in LAUNCH_ENV if k in os.environ}
    yield
    for key in LAUNCH_ENV:
        os.environ.pop(key, None)
    os.environ.update(before)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A quickly built tiny model (short warm start): enough to exercise the loop, not to learn."""
    from stare.models.tiny import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny-test", sft_max_steps=30, sft_target_accuracy=2.0, n_val=16, n_eval=16
    )


@pytest.fixture
def fast_overrides(tiny_model_dir, tmp_path):
    """Config overrides for a fast embedded run in a temporary folder."""
    return fast_override_list(tiny_model_dir, tmp_path / "runs")


def pytest_collection_modifyitems(config, items):
    """A test that takes a real redis-server through a fixture is marked `redis` (-m "not redis"
    runs without one)."""
    for item in items:
        if "redis_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.redis)
