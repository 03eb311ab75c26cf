"""Two `stare up` runs side by side on one machine, configured with the same ports (a real redis-server
each, every role a process): every port is chosen, never assumed. Both finish with no role restarted;
each learner binds its own weight-broadcast port and each run's worker joins only its own learner; the
configured API port goes to the first run and the second says who holds it and takes a free one.

On 818deb8 both launchers found the configured ports free (nothing had bound them yet), so the second
run's learner died with EADDRINUSE (and its control plane too), and its worker could join the first
run's learner."""

from __future__ import annotations

import json
import os
import re
import urllib.request

import pytest
from redis_fixtures import have_redis_server
from test_up import Run, _config

from stare.runtime.net import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.redis,
    pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed"),
]


def _status(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/v1/status", timeout=10) as r:
        return json.loads(r.read())


def test_two_runs_with_the_same_configured_ports_run_side_by_side_to_the_end(tiny_model_dir, tmp_path):
    broadcast, api = free_port(), free_port()  # configured in both runs
    runs = []
    for name in ("left", "right"):
        cfg = _config(
            tiny_model_dir,
            tmp_path / name,
            3,
            run__name=name,
            system__broadcast_port=broadcast,
            control_plane__port=api,
        )
        runs.append(Run(cfg, rollout=1, reward=1))
    left, right = runs
    assert left.launcher.cfg.control_plane.port == api  # the first takes the configured API port
    assert right.launcher.cfg.control_plane.port != api
    assert f"control_plane.port {api} on 127.0.0.1 is in use by pid {os.getpid()}" in right.log.getvalue()
    with left, right:
        urls = [f"http://127.0.0.1:{r.launcher.cfg.control_plane.port}" for r in runs]
        assert [_status(u)["run_id"] for u in urls] == ["left", "right"]
        left.wait_finished()
        right.wait_finished()
    ports = {}
    for run in runs:
        log = run.log.getvalue()
        restarts = {name: r.restarts for name, r in run.launcher.roles.items()}
        assert restarts == dict.fromkeys(restarts, 0), f"{run.dir.name}: roles restarted {restarts}\n{run.tail()}"
        assert "EADDRINUSE" not in log and "Traceback" not in log, run.tail(200)
        announced = re.findall(rf"weight broadcast of {run.dir.name} epoch 1 at 127\.0\.0\.1:(\d+)", log)
        assert len(announced) == 1, run.tail(200)
        ports[run.dir.name] = int(announced[0])
        assert re.search(r"weight receiver rollout-0 joined epoch 1 generation 1 ", log), run.tail(200)
        assert "not joining it" not in log
    assert ports["left"] != ports["right"]
