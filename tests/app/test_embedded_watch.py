"""End to end on `stare train` (tiny model, real DeepSpeed on CPU): data.epochs decides the run's length and
ends it when the prompts are used up, a resume with more epochs continues it; every evaluation keeps its sample
generations; chat data on the character-level tiny model is warned about; a step longer than dead_after_s leaves
the learner listed alive."""

import json
import time
from pathlib import Path

import pytest

from stare.app.launch.embedded import EmbeddedRun, StopFlag, run_training
from stare.app.launch.run_folder import prepare_run
from stare.config import build_config
from stare.runstate import MemoryRunState, RunSteering

pytestmark = pytest.mark.slow


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _train(overrides: list[str], capsys) -> tuple[Path, str]:
    """A new run with progress output (its log lines on stderr, read back)."""
    run_dir = run_training(prepare_run(build_config({}, overrides=overrides), None), progress=True)
    return run_dir, capsys.readouterr().err


def test_epochs_set_the_length_generations_are_kept_and_a_resume_adds_epochs(fast_overrides, capsys):
    extra = ["run.steps=null", "data.epochs=1", "data.max_prompts=4", "task.eval_every=1", "logging.eval_generations=3"]
    run_dir, err = _train(fast_overrides + extra, capsys)
    assert "data.epochs=1 over 4 prompts at 2 per step: 2 steps (run.steps)" in " ".join(err.split())
    metrics = _lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for key in ("unk_rate_prompt", "unk_rate_response", "equal_reward_groups", "zero_reward_steps"):
        assert key in metrics[-1], key
    assert metrics[-1]["unk_rate_prompt"] == 0.0  # the arithmetic prompts are the tiny tokenizer's alphabet
    evals = _lines(run_dir / "eval.jsonl")
    assert [(e["step"], e["final"]) for e in evals] == [(0, False), (1, False), (2, True)]
    assert all("generations" not in e for e in evals)
    generations = _lines(run_dir / "generations.jsonl")
    assert [g["step"] for g in generations] == [0] * 3 + [1] * 3 + [2] * 3  # 3 per evaluation (one data source)
    assert len({g["problem_id"] for g in generations}) == 3  # the same problems every time
    first = generations[0]
    assert set(first) == {"step", "data_source", "problem_id", "prompt", "ground_truth", "response", "score",
                          "sampled_response", "sampled_score"}  # fmt: skip
    assert first["prompt"].endswith("=") and first["score"] in (0.0, 1.0)
    assert (run_dir / "hf" / "model.safetensors").is_file()  # finished: exported
    import yaml

    assert yaml.safe_load((run_dir / "config.yaml").read_text())["run"]["steps"] is None  # as given
    run_training(prepare_run(None, run_dir, ["data.epochs=2"]), resume=True, progress=False)
    assert [m["step"] for m in _lines(run_dir / "metrics.jsonl")] == [1, 2, 3, 4]


def test_the_data_running_out_ends_the_run_before_run_steps(fast_overrides, capsys):
    extra = ["run.steps=10", "data.epochs=1", "data.max_prompts=5", "run.name=out"]
    run_dir, err = _train(fast_overrides + extra, capsys)
    said = " ".join(err.split())
    assert (
        "data.epochs=1 over 5 prompts at 2 per step: at most 2 steps; the data ends the run before run.steps=10" in said
    )
    assert "data.epochs=1 used up at step 2 (5 prompts handed out; 1 trainable group(s) left" in said
    assert [m["step"] for m in _lines(run_dir / "metrics.jsonl")] == [1, 2]
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000002"
    assert _lines(run_dir / "eval.jsonl")[-1] == {**_lines(run_dir / "eval.jsonl")[-1], "step": 2, "final": True}
    assert (run_dir / "hf" / "model.safetensors").is_file()  # a finished run, not a stopped one


def test_chat_data_on_the_character_level_tiny_model_is_warned_about(fast_overrides, tmp_path, capsys):
    rows = [
        {"data_source": "chat", "prompt": [{"role": "user", "content": f"What is {i} plus {i}? Put it in a box."}],
         "reward_model": {"ground_truth": str(2 * i)}}
        for i in range(20)
    ]  # fmt: skip
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    extra = ["task.name=dataset", f"task.path={data}", f"task.test_path={data}", "run.steps=1", "run.name=chat"]
    run_dir, err = _train(fast_overrides + extra, capsys)
    said = " ".join(err.split())
    assert "warning: training prompts:" in said and "of their characters are lost by the tokenizer" in said
    (metrics,) = _lines(run_dir / "metrics.jsonl")
    assert metrics["data_chars_lost"] > 0.5 and "unk_rate_prompt" in metrics


def test_a_step_longer_than_dead_after_s_leaves_the_learner_alive(fast_overrides):
    cfg = prepare_run(
        build_config(
            {}, overrides=fast_overrides + ["run.steps=1", "run.name=long", "system.heartbeat_s=0.2",
                                            "system.dead_after_s=1.0"]
        ),
        None,
    )  # fmt: skip
    state = MemoryRunState("long", dead_after_s=1.0)
    run = EmbeddedRun(cfg, resume=False, log=lambda *_: None, steering=RunSteering(state, heartbeat_s=0.2))
    step, seen = run.learner.train_step, []

    def long_step(trajectories):  # the real step, then 3 x dead_after_s more of computing inside it
        metrics = step(trajectories)
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            sum(range(1000))
            # at 0.5, 1.5 and 2.5 s: the first after a heartbeat interval inside the step (the beat before it
            # may be older than the step)
            if len(seen) < int(3.0 - (end - time.monotonic()) + 0.5):
                seen.append(([r for r in state.roles() if r.role == "learner"], state.status()["phase"]))
        return metrics

    run.learner.train_step = long_step
    try:
        run.train(StopFlag())
    finally:
        run.close()
    assert len(seen) >= 3
    for roles, phase in seen:
        assert phase == "training" and roles and roles[0].alive and roles[0].info.get("busy") == "training step"
