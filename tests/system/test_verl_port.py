"""A verl user's port, end to end: a verl-format parquet dataset (chat prompts, reward_model.ground_truth,
extra_info) and a verl `compute_score` file that raises on one data source and hangs on another, through
`stare train` (a real CLI process) and `stare up` (every role a real process, a real redis-server).
Each failing response scores 0 and is counted; the held-out evaluation counts its own; the run finishes.

Counts by hand: the training file has 4 rows (ok, raises, hangs, ok) and the run trains 2 steps of 2
prompts with dynamic sampling off, on-policy: every row is drawn once, so 2 rows x 4 samples = 8 training
responses fail. The held-out file has 3 rows (ok, raises, hangs), each scored greedily once and sampled
twice: 2 x 3 = 6 failures per evaluation. The ok rows' score reads extra_info (a KeyError would add failures).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

COMPUTE_SCORE = """
import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source == "raises":
        raise ValueError("no verifier for this source")
    if data_source == "hangs":
        time.sleep(3600)
    return float(solution_str.strip().lstrip("#") == ground_truth) * extra_info["scale"]
"""
SAMPLES, PROMPTS, STEPS, EVAL_K = 4, 2, 2, 2
TRAIN = [("ok", "6-9=", "-3"), ("raises", "7*3-9=", "12"), ("hangs", "13-3+17=", "27"), ("ok", "4+4=", "8")]
TEST = [("ok", "2+3=", "5"), ("raises", "9-1=", "8"), ("hangs", "5*5=", "25")]
TRAIN_ERRORS = SAMPLES * sum(source != "ok" for source, _, _ in TRAIN)  # every row drawn once: 8
EVAL_ERRORS = (1 + EVAL_K) * sum(source != "ok" for source, _, _ in TEST)  # greedy + samples: 6


def _parquet(path: Path, rows) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [
        {
            "data_source": source,
            "prompt": [{"role": "user", "content": prompt}],  # verl's chat list
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": path.stem, "index": i, "scale": 1.0},
        }
        for i, (source, prompt, answer) in enumerate(rows)
    ]
    pq.write_table(pa.Table.from_pylist(records), path)
    return path


def _raw_config(tmp_path: Path, model_dir: Path, name: str) -> dict:
    reward = tmp_path / "my_reward.py"
    reward.write_text(COMPUTE_SCORE)
    return {
        "run": {"name": name, "output_dir": str(tmp_path / "runs"), "steps": STEPS, "checkpoint_every": 1,
                "threads": 1},
        "model": {"path": str(model_dir)},
        "task": {"name": "dataset", "path": str(_parquet(tmp_path / "train.parquet", TRAIN)),
                 "test_path": str(_parquet(tmp_path / "test.parquet", TEST)), "eval_problems": 8,
                 "eval_every": 100, "eval_k": EVAL_K},
        "rollout": {"prompts_per_step": PROMPTS, "samples_per_prompt": SAMPLES, "max_new_tokens": 8},
        "data": {"dynamic_sampling": False},
        "optim": {"micro_batch": 8},
        "reward": {"components": [{"kind": "function", "path": str(reward), "function": "compute_score"}],
                   "scoring": {"workers": 2, "timeout_s": 2.0}},
        "control_plane": {"port": 0, "allow_unauthenticated": True},
    }  # fmt: skip


def _check_counts(run_dir: Path) -> None:
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert metrics[-1]["reward_errors_total"] == TRAIN_ERRORS
    assert sum(m["reward_errors"] for m in metrics) == TRAIN_ERRORS
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert len(evals) >= 2 and all(e["reward_errors"] == EVAL_ERRORS for e in evals), evals
    assert all(e["problems"] == len(TEST) for e in evals)


def test_stare_train_ports_a_verl_dataset_and_compute_score(tmp_path, tiny_model_dir):
    from learner.engine.deepspeed_engine import child_env

    (tmp_path / "port.yaml").write_text(yaml.safe_dump(_raw_config(tmp_path, tiny_model_dir, "port")))
    proc = subprocess.run(
        [sys.executable, "-m", "stare.app.cli", "train", "--config", str(tmp_path / "port.yaml"), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_counts(tmp_path / "runs" / "port")
    # each failure logged with its sample: the component, the cause, the data source, the response
    assert "reward failed, scored 0: compute_score: ValueError: no verifier for this source" in proc.stderr
    assert "reward failed, scored 0: scoring process: timed out after 2 s" in proc.stderr
    assert "data_source=hangs" in proc.stderr and "response=" in proc.stderr


@pytest.mark.redis
def test_stare_up_ports_a_verl_dataset_and_compute_score(tmp_path, tiny_model_dir):
    import io

    from redis_fixtures import have_redis_server

    from stare.app.launch.processes import ProcessLauncher
    from stare.config import build_config

    if not have_redis_server():
        pytest.skip("redis-server is not installed")
    raw = _raw_config(tmp_path, tiny_model_dir, "port-up")
    raw["system"] = {"max_staleness": 0, "heartbeat_s": 0.5, "claim_idle_s": 3.0, "broadcast_timeout_s": 10.0}
    out = io.StringIO()
    launcher = ProcessLauncher(build_config(raw), rollout=1, reward=1, out=out, color=False, grace_s=30)
    deadline = time.monotonic() + 480
    launcher.start()
    try:  # returns the learner's exit code when it finishes (0 at the deadline: the counts then fail)
        code = launcher.supervise(until=lambda: time.monotonic() > deadline, poll_s=0.2)
    finally:
        launcher.stop()
    log = out.getvalue()
    assert code == 0, log[-3000:]
    _check_counts(tmp_path / "runs" / "port-up")
    assert "compute_score: ValueError: no verifier for this source" in log, log[-3000:]
    assert "scoring process: timed out after 2 s" in log
