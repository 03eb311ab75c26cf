"""End to end: `stare train` with multi-turn tool use (tool-arithmetic task, real ProcessSandbox,
real DeepSpeed on CPU), few steps, a quickly warm-started tiny model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from rollout.agent_loop import parse_tool_call
from stare.app.launch.embedded import EmbeddedRun, run_training
from stare.app.launch.run_folder import prepare_run
from stare.config import build_config

pytestmark = pytest.mark.slow

OBS_OPEN, OBS_CLOSE = "<tool_response>", "</tool_response>"


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory):
    """80 warm-start steps: the model writes tool calls (often with wrong digits), not yet answers."""
    from stare.models.tiny import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny-tool-test",
        task_name="tool-arithmetic",
        sft_max_steps=80,
        sft_target_accuracy=2.0,
        sft_check_every=1000,
        n_val=8,
        n_eval=16,
    )


@pytest.fixture
def tool_overrides(tool_model_dir, tmp_path):
    return [
        f"model.path={tool_model_dir}",
        f"run.output_dir={tmp_path / 'runs'}",
        "run.name=tool",
        "run.steps=2",
        "run.checkpoint_every=100",
        "run.threads=1",
        "task.name=tool-arithmetic",
        "task.eval_problems=8",
        "task.eval_every=100",
        "task.eval_k=2",
        "rollout.prompts_per_step=4",
        "rollout.samples_per_prompt=4",
        "rollout.max_new_tokens=32",
        "rollout.tool_use.enabled=true",
        "rollout.tool_use.max_turns=2",
        "rollout.tool_use.max_observation_tokens=16",
        "optim.micro_batch=8",
        "data.max_sampling_rounds=2",
        "data.dynamic_sampling=false",
    ]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_rollouts_use_the_tool_and_mask_the_observations(tool_overrides):
    run = EmbeddedRun(build_config({}, overrides=tool_overrides), resume=False, log=lambda *_: None)
    try:
        trajectories, _, info = run.sample()
    finally:
        run.close()
    assert len(trajectories) == 16
    multi = [t for t in trajectories if t.turns > 1]
    assert multi, "no trajectory called the tool"
    assert info["tool_call_rate"] == pytest.approx(len(multi) / 16)
    tok = run.tokenizer
    for t in trajectories:
        t.validate()
        masked = np.flatnonzero(t.loss_mask == 0)
        if t.turns == 1:
            assert masked.size == 0
            continue
        # One tool call: one contiguous masked span, exactly the observation, with logprob 0.
        assert masked.size > 0 and np.all(np.diff(masked) == 1)
        span = tok.decode(t.response_token_ids[masked], skip_special_tokens=True)
        assert span.startswith(OBS_OPEN) and span.endswith(OBS_CLOSE), span
        assert np.all(t.response_logprobs[masked] == 0.0)
        before = tok.decode(t.response_token_ids[: masked[0]], skip_special_tokens=True)
        assert before.endswith("</tool_call>") and np.all(t.response_logprobs[: masked[0]] < 0)
        # The observation is what the sandbox printed for the code the model wrote.
        code, error = parse_tool_call(before)
        if code is not None and re.fullmatch(r"print\(\d{1,9}\*\d{1,9}\)", code):
            a, b = code[len("print(") : -1].split("*")
            assert span == f"{OBS_OPEN}{int(a) * int(b)}{OBS_CLOSE}"
        elif code is None:
            body = tok.decode(tok.encode(f"error: {error}", add_special_tokens=False)[:14])  # 16 - 2 tag tokens
            assert span == f"{OBS_OPEN}{body}{OBS_CLOSE}"


def test_stare_train_runs_with_tool_use(tool_overrides):
    cfg = build_config({}, overrides=tool_overrides)
    run_dir = run_training(prepare_run(cfg, None), progress=False)
    metrics = _lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(0.0 <= m["tool_call_rate"] <= 1.0 and 1.0 <= m["turns_mean"] <= 2.0 for m in metrics)
    assert max(m["tool_call_rate"] for m in metrics) > 0
    evals = _lines(run_dir / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2] and "tool_call_rate" in evals[-1]
    assert (run_dir / "report" / "summary.md").exists()
    saved = build_config(__import__("yaml").safe_load((run_dir / "config.yaml").read_text()))
    assert saved.rollout.tool_use.enabled and saved.rollout.tool_use.sandbox.cpu_s == 2
