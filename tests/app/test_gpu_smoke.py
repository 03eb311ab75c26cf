"""scripts/gpu_smoke.py at its CPU size (--cpu-tiny), so the GPU smoke test cannot rot: it runs the
project's Learner and `stare train`, and its figures are what their definitions say."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
SCRIPT = REPO / "scripts" / "gpu_smoke.py"

# The --cpu-tiny model (TINY in the script): vocab 512, hidden 64, 2 layers, 4 heads (head_dim 16),
# 2 kv heads (kv_dim 32), MLP 128, tied embeddings. By hand: embedding 512 x 64 = 32,768; per layer
# q 64x64 + 64 = 4,160, k and v 64x32 + 32 = 2,080 each, o 4,096, MLP 3 x 64x128 = 24,576, norms 128
# -> 37,120; total 32,768 + 2 x 37,120 + 64 = 107,072, all of it matmul weights (the lm_head is tied).
TINY_PARAMS = 107_072
ROWS, SEQ = 16, 48  # --cpu-tiny sizes
STATE_BYTES = 4 * TINY_PARAMS  # fp32, each storage once: the tied lm_head.weight travels as a view of the embedding
FLOPS_PER_TOKEN = 8 * TINY_PARAMS + 8 * 2 * 64 * SEQ  # 8 N + 8 layers x hidden x seq


def run_smoke(out: Path, *extra: str) -> dict:
    from learner.engine.deepspeed_engine import child_env

    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-tiny", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=540,
        env=child_env(),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "tokens/s:" in proc.stdout and "peak memory:" in proc.stdout
    return json.loads((out / "gpu_smoke.json").read_text())


def test_cpu_tiny_learner_figures_follow_their_definitions(tmp_path):
    result = run_smoke(tmp_path, "--train-steps", "0", "--peak-tflops", "0.5")
    r = result["learner"]
    assert r["params"] == TINY_PARAMS and (r["rows"], r["seq"]) == (ROWS, SEQ)
    assert r["gradient_checkpointing_on_model"]  # optim.gradient_checkpointing reached the model
    assert len(r["step_s"]) == 3 and len(r["metrics"]) == 3
    assert all(m["train_tokens"] == ROWS * (SEQ - 16) for m in r["metrics"])  # every response token trains
    mean_s = sum(r["step_s"][1:]) / 2  # the first step warms up
    assert r["tokens_per_s"] == pytest.approx(ROWS * SEQ / mean_s, rel=1e-9)
    assert r["model_tflops_per_step"] == pytest.approx(FLOPS_PER_TOKEN * ROWS * SEQ / 1e12, rel=1e-12)
    assert r["mfu"] == pytest.approx(r["achieved_tflops"] / 0.5, rel=1e-9)
    assert r["peak_memory_bytes"] > 0 and r["plan_learner_bytes"] > 0
    pub = r["publish"]  # the weight publish both ways: the same bytes, all of the model's (fp32), the
    assert pub["same_bytes"] and pub["device"]["bytes"] == pub["host"]["bytes"] == STATE_BYTES  # tied head once
    assert pub["device"]["devices"] == pub["host"]["devices"] == ["cpu"]  # CPU: the tensors' own device
    assert "train" not in result
    c = r["colocate"]  # the colocated cycle (hf engine asleep, optimizer offloaded, back): on CPU nothing moves
    assert c["weights_restored"] and c["sample_logprobs_finite"] and c["sampled_tokens"] > 0
    assert c["engine_weight_bytes"] >= 4 * TINY_PARAMS and c["optimizer_state_bytes"] > 0
    assert c["offload"].startswith("deepspeed offload_states") and c["engine_freed_bytes"] == 0


def test_cpu_tiny_learner_under_zero3_publishes_the_gathered_weights(tmp_path):
    r = run_smoke(tmp_path, "--train-steps", "0", "--zero-stage", "3")["learner"]
    assert r["zero_stage"] == 3 and all(m["train_tokens"] == ROWS * (SEQ - 16) for m in r["metrics"])
    assert r["publish"]["same_bytes"] and r["publish"]["device"]["bytes"] == STATE_BYTES


@pytest.mark.slow
def test_cpu_tiny_runs_stare_train_too(tmp_path):
    result = run_smoke(tmp_path, "--train-steps", "2")
    t = result["train"]
    assert t["steps"] == 2 and t["last"]["step"] == 2 and t["colocated"]  # system.colocate=on
    assert (tmp_path / "runs" / "gpu-smoke-train" / "metrics.jsonl").is_file()
