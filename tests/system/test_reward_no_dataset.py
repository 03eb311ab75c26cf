"""A `stare reward` process scores `task.name: dataset` trajectories with no dataset file present:
the ground truth travels with each trajectory (what the GPU compose profile and k8s reward.yaml
mount: only the config). A real role process, a real redis-server."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from redis_fixtures import have_redis_server, redis_server

from learner.engine.deepspeed_engine import child_env
from stare.data.tasks.registry import build_verifier
from stare.transport.record_tag import RecordTrust, record_key
from stare.transport.records import Trajectory
from stare.transport.redis_transport import RedisTransport

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed")]

CASES = [  # (response, ground truth, reward by hand)
    (r"so the answer is \boxed{34}", "34", 1.0),
    (r"so the answer is \boxed{35}", "34", 0.0),
    (r"Answer: \frac{1}{2}", "0.5", 1.0),  # math-verify equivalence: 1/2 == 0.5
    ("no final answer at all", "7", 0.0),
]


def _trajectory(i: int, text: str, answer: str) -> Trajectory:
    return Trajectory(
        run_id="nodata",
        trajectory_id=f"g{i}:0",
        group_id=f"g{i}",
        group_size=2,
        weight_version=0,
        prompt_token_ids=np.asarray([1, 2], dtype=np.int32),
        response_token_ids=np.asarray([3, 4, 5], dtype=np.int32),
        response_logprobs=np.full(3, -0.5, dtype=np.float32),
        loss_mask=np.ones(3, dtype=np.uint8),
        finish_reason="stop",
        answer=answer,
        problem_id=f"math_dapo-{i}",
        data_source="math_dapo",
        response_text=text,
        level=1,
    )


def test_the_dataset_verifier_opens_no_file_and_scores_by_hand():
    verifier = build_verifier("dataset")
    from stare.data.tasks.base import Problem

    got = [verifier.reward(Problem("", answer, "p", 1, "math_dapo"), text) for text, answer, _ in CASES]
    assert got == [c[2] for c in CASES]
    with pytest.raises(ValueError, match="no problems"):
        verifier.problems("train", 1, 0)


def test_a_reward_process_scores_dataset_trajectories_without_the_dataset(tmp_path: Path):
    missing = tmp_path / "not-mounted"
    cfg = {
        "run": {"name": "nodata", "output_dir": str(tmp_path / "runs")},
        "model": {"path": str(missing / "model")},
        "task": {"name": "dataset", "path": str(missing / "train.parquet")},
        "system": {"heartbeat_s": 0.5},
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert not missing.exists()
    with redis_server(tmp_path / "redis") as server:
        env = {**child_env(), "STARE_REDIS_URL": server.url}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from stare.app.cli import main; main()",
                "reward",
                "--config",
                str(tmp_path / "cfg.yaml"),
                "--name",
                "reward-0",
                "--workers",
                "1",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # the run's record key, as the roles derive it (the Redis password): the reward worker trusts only tagged records
        key, _ = record_key("nodata", server.url, environ={})
        transport = RedisTransport.connect(server.url, "nodata", block_ms=500, trust=RecordTrust(key))
        try:
            transport.raw.publish([_trajectory(i, text, answer) for i, (text, answer, _) in enumerate(CASES)])
            scored, deadline = {}, time.monotonic() + 120
            while len(scored) < len(CASES):
                assert proc.poll() is None, proc.communicate(timeout=10)[0][-3000:]
                assert time.monotonic() < deadline, "the reward worker scored nothing in 120 s"
                for d in transport.scored.consume("test", 16, block_s=0.5):
                    scored[d.record.trajectory_id] = d.record
        finally:
            transport.close()
            proc.terminate()
            out = proc.communicate(timeout=60)[0]
    assert [scored[f"g{i}:0"].reward for i in range(len(CASES))] == [c[2] for c in CASES], out[-3000:]
    assert all("error" not in scored[f"g{i}:0"].reward_info for i in range(len(CASES)))
    assert not missing.exists()  # nothing created a dataset either
