"""The session with an evaluator that waits on other processes (`remote`): the step is logged
(trained ids) and checkpointed before the wait, so a learner killed while it waits loses no
training; a resumed run whose step's evaluation is missing from eval.jsonl evaluates it first.
The session of `stare train` (in-memory seams, real DeepSpeed on CPU) with a recording evaluator
in place of the streams."""

import json
from pathlib import Path

import pytest

from stare.app.launch.embedded import EmbeddedRun
from stare.config import build_config

pytestmark = pytest.mark.slow


class RecordingRemoteEvaluator:
    """Notes, when called, which checkpoints and trained steps the run folder already holds."""

    remote = True

    def __init__(self, run_dir: Path):
        self.run_dir, self.calls = run_dir, []

    def __call__(self, version, weights, final=False):
        trained = self.run_dir / "trained.jsonl"
        self.calls.append(
            {
                "version": version,
                "checkpoints": sorted(p.name for p in (self.run_dir / "checkpoints").glob("step_*")),
                "trained_steps": [json.loads(line)["step"] for line in trained.read_text().splitlines()]
                if trained.exists()
                else [],
            }
        )
        return {"greedy_accuracy": 0.25, "pass_at_k": 0.5, "avg_at_k": 0.375, "k": 2}


def _run(cfg, resume: bool) -> tuple[EmbeddedRun, RecordingRemoteEvaluator]:
    run = EmbeddedRun(cfg, resume=resume, log=lambda *a: None)
    evaluator = RecordingRemoteEvaluator(cfg.run_dir)
    run.session.seams.evaluator = evaluator
    return run, evaluator


def test_a_remote_evaluation_waits_after_the_checkpoint_and_a_lost_one_is_redone_on_resume(fast_overrides):
    cfg = build_config({}, overrides=[*fast_overrides, "task.eval_every=1", "run.checkpoint_every=100"])
    run, evaluator = _run(cfg, resume=False)
    try:
        run.train()
    finally:
        run.close()
    # step 0: nothing to save; steps 1 and 2: saved (checkpoint and lineage) before the wait
    assert evaluator.calls == [
        {"version": 0, "checkpoints": [], "trained_steps": []},
        {"version": 1, "checkpoints": ["step_000001"], "trained_steps": [1]},
        {"version": 2, "checkpoints": ["step_000001", "step_000002"], "trained_steps": [1, 2]},
    ]
    eval_file = cfg.run_dir / "eval.jsonl"
    assert [json.loads(line)["step"] for line in eval_file.read_text().splitlines()] == [0, 1, 2]
    # a learner killed while it waited for step 2's evaluation: eval.jsonl lacks it
    eval_file.write_text("".join(line + "\n" for line in eval_file.read_text().splitlines()[:2]))
    again, evaluator = _run(cfg, resume=True)
    try:
        again.train()
    finally:
        again.close()
    assert [c["version"] for c in evaluator.calls] == [2]
    assert [json.loads(line)["step"] for line in eval_file.read_text().splitlines()] == [0, 1, 2]
    trained = [json.loads(line)["step"] for line in (cfg.run_dir / "trained.jsonl").read_text().splitlines()]
    assert trained == [1, 2]  # written once per step
