"""`stare up --target ray` (old spelling `stare launch --ray`) end to end on a local Ray cluster (CPU): control, learner, 2 rollout and
1 reward actors against a real redis-server, with real weight broadcast between actors.

A rollout actor's process is SIGKILLed mid-run; Ray must restart it (a new pid, reporting
`was_current_actor_reconstructed`), and the run must finish with the data lineage of
tests/system/test_up.py: nothing lost, nothing trained twice. Everything stays on loopback
(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes Ray use 127.0.0.1 as the node address).
"""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import tempfile
import threading
import time
import urllib.request

import pytest
from redis_fixtures import have_redis_server
from test_up import _assert_nothing_lost_or_trained_twice, _config, _whole_lines

from stare.runstate.redis_state import RedisRunState

pytestmark = [
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install 'stare[ray]')"
    ),
    pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed"),
]

STEPS = 30


@pytest.fixture
def local_ray(monkeypatch):
    """Environment for a local Ray cluster on loopback with its files in a short temporary folder
    (Ray's socket paths must stay under 108 characters); yields ray.init's arguments."""
    tmp = tempfile.mkdtemp(prefix="stare-ray-", dir="/tmp")
    for key, value in {
        "RAY_TMPDIR": tmp,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
    }.items():
        monkeypatch.setenv(key, value)
    import ray

    assert not ray.is_initialized()
    yield {"num_cpus": 8, "include_dashboard": False, "_temp_dir": tmp, "log_to_driver": True}
    if ray.is_initialized():  # the launcher shuts down what it started; this is for a failed start
        ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


def _steps_done(run_dir) -> int:
    path = run_dir / "metrics.jsonl"
    lines = [json.loads(line) for line in _whole_lines(path)] if path.exists() else []
    return lines[-1]["step"] if lines else 0


def test_ray_launch_trains_and_survives_a_killed_rollout_actor(tiny_model_dir, tmp_path, local_ray):
    import ray

    from stare.app.launch.ray import RayLauncher
    from stare.runtime.run_lock import RunLock, RunLockError

    cfg = _config(tiny_model_dir, tmp_path, STEPS, run__name="ray")
    out = io.StringIO()
    launcher = RayLauncher(
        cfg,
        rollout=2,
        reward=1,
        max_restarts=3,
        grace_s=30,
        start_timeout_s=300,
        call_timeout_s=30,
        init_kwargs=local_ray,
        out=out,
    )
    result: dict[str, int] = {}

    def tail() -> str:
        return "\n".join(out.getvalue().splitlines()[-40:])

    try:
        t0 = time.monotonic()
        launcher.start()
        print(f"ray and 5 actors started in {time.monotonic() - t0:.1f}s")
        assert launcher.endpoint[0] == "127.0.0.1", launcher.endpoint
        with urllib.request.urlopen(f"{launcher.control_url}/v1/health", timeout=10) as resp:
            assert resp.status == 200
        supervisor = threading.Thread(target=lambda: result.update(code=launcher.supervise(poll_s=0.3)), daemon=True)
        supervisor.start()

        deadline = time.monotonic() + 300  # ~30 s on an idle 2-core box; slack for a loaded CI runner
        while _steps_done(cfg.run_dir) < 3:
            assert supervisor.is_alive(), tail()
            assert time.monotonic() < deadline, f"step 3 not reached in 300s\n{tail()}"
            time.sleep(0.2)
        state = RedisRunState.connect(launcher.redis_url, cfg.run.name)
        state.set_paused(True)  # the run cannot finish before the supervisor sees the restart, however fast it is
        killed = launcher.kill("rollout-0")
        # one writer per run folder: the driver holds it, its learner actor trains under it (the token)
        with pytest.raises(RunLockError, match="is in use by pid"):
            RunLock(cfg.run_dir, resume=True).acquire()
        while launcher.restarts["rollout-0"] < 1:
            assert supervisor.is_alive() and time.monotonic() < deadline, f"no restart of rollout-0 seen\n{tail()}"
            time.sleep(0.2)
        state.set_paused(False)
        state.close()

        supervisor.join(timeout=300)
        assert not supervisor.is_alive(), f"the run did not finish in 300s\n{tail()}"
        assert result["code"] == 0, tail()
        print(f"trained {STEPS} steps in {time.monotonic() - t0:.1f}s")
        after = ray.get(launcher.actors["rollout-0"].status.remote(), timeout=30)
        assert after["pid"] != killed and after["reconstructed"], after
        assert launcher.restarts == {"control": 0, "learner": 0, "rollout-0": 1, "rollout-1": 0, "reward-0": 0}, tail()
        assert f"rollout-0 was restarted by Ray on 127.0.0.1 (pid {killed} -> {after['pid']}" in out.getvalue()
    finally:
        launcher.stop()
    assert not ray.is_initialized(), "the launcher started Ray, so it shuts it down"
    assert launcher.redis.proc.poll() is not None, "our redis-server is stopped"
    assert (cfg.run_dir / ".lock").read_text() == "", "the run lock is released"
    _assert_nothing_lost_or_trained_twice(cfg.run_dir, STEPS, launcher.redis)
