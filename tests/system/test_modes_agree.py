"""The two modes are one algorithm: for the same seed and config, strictly on-policy, one rollout and
one reward worker and the rollout batch equal to a step's prompts, `stare up` (every role its own
process, Redis streams, a gloo weight broadcast) trains the same trajectories and logs the same
metrics as `stare train` (one process, in-memory seams)."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import pytest
from redis_fixtures import have_redis_server

from stare.config import build_config
from stare.embedded import prepare_run, run_training
from stare.launch import Launcher

pytestmark = [pytest.mark.slow, pytest.mark.redis,
              pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed")]

STEPS = 3
COMPARED = ("entropy", "loss", "reward_mean", "gate", "w", "m", "clip_fraction", "response_length_mean",
            "train_tokens", "groups")
EVAL_COMPARED = ("greedy_accuracy", "pass_at_k", "avg_at_k", "per_level", "per_source")


def _config(model_dir: Path, out: Path, name: str):
    return build_config({
        "run": {"name": name, "output_dir": str(out), "steps": STEPS, "checkpoint_every": 10, "threads": 1},
        "model": {"path": str(model_dir)},
        "task": {"eval_problems": 4, "eval_every": 1000, "eval_k": 2},
        "rollout": {"prompts_per_step": 3, "samples_per_prompt": 4, "max_new_tokens": 12},
        "data": {"dynamic_sampling": True, "max_sampling_rounds": 10},
        "optim": {"lr": 3e-4, "micro_batch": 6},
        # the gate on (target above any entropy here) and the sign schedule moving W and M every step
        "controller": {"target": 5.0, "schedule": "sign", "alpha": 0.5, "w_max": 10.0, "m_min": 0.1, "adaptive": True},
        "system": {"max_staleness": 0, "rollout_batch_prompts": 3, "heartbeat_s": 0.5,
                   "broadcast_timeout_s": 20.0},
        "control": {"port": 0, "allow_unauthenticated": True, "serve_in_train": False},
    })


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_stare_up_and_stare_train_train_the_same_trajectories_with_the_same_metrics(tiny_model_dir, tmp_path):
    embedded = run_training(prepare_run(_config(tiny_model_dir, tmp_path, "embedded"), None), progress=False)

    cfg = _config(tiny_model_dir, tmp_path, "distributed")
    log = io.StringIO()
    launcher = Launcher(cfg, rollout=1, reward=1, out=log, color=False, grace_s=30, control=False)
    launcher.start()
    code: list[int] = []
    thread = threading.Thread(target=lambda: code.append(launcher.supervise(poll_s=0.2)), daemon=True)
    thread.start()
    thread.join(timeout=420)
    launcher.stop()
    assert code == [0], log.getvalue()[-4000:]
    distributed = cfg.run_dir

    trained_e = [r["ids"] for r in _lines(embedded / "trained.jsonl")]
    trained_d = [r["ids"] for r in _lines(distributed / "trained.jsonl")]
    assert len(trained_e) == STEPS and trained_d == trained_e  # the same trajectories, step by step
    metrics_e, metrics_d = _lines(embedded / "metrics.jsonl"), _lines(distributed / "metrics.jsonl")
    assert [m["step"] for m in metrics_d] == [m["step"] for m in metrics_e] == list(range(1, STEPS + 1))
    assert any(m["gate"] for m in metrics_e) and len({m["w"] for m in metrics_e}) > 1  # the controller moved
    for e, d in zip(metrics_e, metrics_d):
        for key in COMPARED:
            assert d[key] == pytest.approx(e[key], abs=1e-5, rel=1e-5), (e["step"], key, e[key], d[key])
    # held-out: in process for `stare train`, through the streams (rollout and reward workers) for
    # `stare up`; the same problems, seeds and weights give the same numbers
    evals_e, evals_d = _lines(embedded / "eval.jsonl"), _lines(distributed / "eval.jsonl")
    assert [r["step"] for r in evals_d] == [r["step"] for r in evals_e] == [0, STEPS]
    assert all(r["complete"] and r["missing_samples"] == 0 for r in evals_d)
    for e, d in zip(evals_e, evals_d):
        assert {k: d[k] for k in EVAL_COMPARED} == {k: e[k] for k in EVAL_COMPARED}, (e, d)
