"""The session with an evaluator that waits on other processes (`remote`): a checkpoint due at the
evaluation's step is written (with the step's lineage) before the wait, so a learner killed while it
waits loses no training; no checkpoint is written for the evaluation alone (at 7B that would be 107 GB
every `task.eval_every` steps), and a learner killed during such a wait retrains from its last
checkpoint and evaluates again; a resumed run whose step's evaluation is missing from eval.jsonl
evaluates it first. The session of `stare train` (in-memory seams, real DeepSpeed on CPU) with a
recording evaluator in place of the streams."""

import json
from pathlib import Path

import pytest

from learner.loop.session_seams import EvaluationStopped
from stare.app.launch.embedded import EmbeddedRun
from stare.config import build_config

pytestmark = pytest.mark.slow


class ProcessDied(Exception):
    pass


class RecordingRemoteEvaluator:
    """Notes, when called, which checkpoints and trained steps the run folder already holds."""

    remote = True

    def __init__(self, run_dir: Path, dies_at_call: int | None = None, stop_at_call=None):
        self.run_dir, self.calls, self.dies_at_call, self.stop_at_call = run_dir, [], dies_at_call, stop_at_call

    def __call__(self, version, weights, final=False):
        if len(self.calls) == self.dies_at_call:
            raise ProcessDied("the learner died while it waited for an evaluation")
        if self.stop_at_call is not None and len(self.calls) == self.stop_at_call[0]:
            self.calls.append({"version": version, "stopped": True})
            self.stop_at_call[1]()  # SIGTERM arrives during the wait; the evaluator ends it (StreamEvaluator does)
            raise EvaluationStopped(f"evaluation v{version}: a stop was requested while waiting")
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


def _run(cfg, resume: bool, dies_at_call: int | None = None, stops_at_call: int | None = None):
    run = EmbeddedRun(cfg, resume=resume, log=lambda *a: None)
    stop = None if stops_at_call is None else (stops_at_call, lambda: setattr(run.stop, "requested", True))
    evaluator = RecordingRemoteEvaluator(cfg.run_dir, dies_at_call, stop)
    run.session.seams.evaluator = evaluator
    return run, evaluator


def test_a_remote_evaluation_at_a_checkpoint_step_waits_after_it_and_a_lost_one_is_redone_on_resume(fast_overrides):
    cfg = build_config({}, overrides=[*fast_overrides, "task.eval_every=1", "run.checkpoint_every=1"])
    run, evaluator = _run(cfg, resume=False)
    try:
        run.train()
    finally:
        run.close()
    # step 0: nothing to save; steps 1 and 2: due, saved (checkpoint and lineage) before the wait
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


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_an_evaluation_between_checkpoints_writes_none_and_a_learner_lost_in_its_wait_retrains_from_the_last(
    fast_overrides,
):
    cfg = build_config({}, overrides=[*fast_overrides, "run.steps=4", "task.eval_every=1", "run.checkpoint_every=2"])
    run, evaluator = _run(cfg, resume=False, dies_at_call=3)  # calls: step 0, 1, 2, then 3 dies
    try:
        with pytest.raises(ProcessDied):
            run.train()
    finally:
        run.close()
    # step 1: no checkpoint due, none written for the evaluation (its lineage follows it); step 2: due,
    # written before the wait
    assert evaluator.calls == [
        {"version": 0, "checkpoints": [], "trained_steps": []},
        {"version": 1, "checkpoints": [], "trained_steps": []},
        {"version": 2, "checkpoints": ["step_000002"], "trained_steps": [1, 2]},
    ]
    assert sorted(p.name for p in (cfg.run_dir / "checkpoints").glob("step_*")) == ["step_000002"]
    assert _steps(cfg.run_dir / "eval.jsonl") == [0, 1, 2]
    assert _steps(cfg.run_dir / "trained.jsonl") == [1, 2]  # step 3 trained, never saved: not in the lineage
    again, evaluator = _run(cfg, resume=True)
    try:
        again.train()
    finally:
        again.close()
    # resumed at step 2 (evaluated already): step 3 retrained and evaluated with no checkpoint before it,
    # step 4 (the last) saved before its wait
    assert [c["checkpoints"] for c in evaluator.calls] == [["step_000002"], ["step_000002", "step_000004"]]
    assert [c["trained_steps"] for c in evaluator.calls] == [[1, 2], [1, 2, 3, 4]]
    assert _steps(cfg.run_dir / "eval.jsonl") == [0, 1, 2, 3, 4]
    assert _steps(cfg.run_dir / "trained.jsonl") == [1, 2, 3, 4]  # each step once


def test_a_stop_during_a_wait_between_checkpoints_saves_the_step_and_the_resumed_run_evaluates_it_first(
    fast_overrides,
):
    cfg = build_config({}, overrides=[*fast_overrides, "run.steps=4", "task.eval_every=1", "run.checkpoint_every=4"])
    run, evaluator = _run(cfg, resume=False, stops_at_call=2)  # step 2's evaluation: no checkpoint due
    try:
        outcome = run.train()
    finally:
        run.close()
    assert [c["version"] for c in evaluator.calls] == [0, 1, 2] and evaluator.calls[2].get("stopped")
    assert outcome.outcome == "stopped"
    # the stop saved the step at once (not after run.checkpoint_every), its evaluation not logged
    assert sorted(p.name for p in (cfg.run_dir / "checkpoints").glob("step_*")) == ["step_000002"]
    assert _steps(cfg.run_dir / "eval.jsonl") == [0, 1]
    assert _steps(cfg.run_dir / "trained.jsonl") == [1, 2]
    again, evaluator = _run(cfg, resume=True)
    try:
        again.train()
    finally:
        again.close()
    # resumed at step 2 with version 2 (nothing newer was published): step 2's evaluation first, of that version
    assert [c["version"] for c in evaluator.calls] == [2, 3, 4]
    assert _steps(cfg.run_dir / "eval.jsonl") == [0, 1, 2, 3, 4]
    assert _steps(cfg.run_dir / "trained.jsonl") == [1, 2, 3, 4]


def test_a_learner_whose_weights_get_a_newer_version_than_any_published_abandons_the_evaluations_left_open(
    fast_overrides, monkeypatch
):
    """A learner killed after its checkpoint published newer weights: the resumed one publishes the checkpoint's
    weights above them, so no evaluation left open can be collected; the session closes them at once (the
    rollout workers would otherwise sample their tasks for nobody until the next evaluation is published)."""
    from learner.loop.session_seams import MemoryCursor
    from rollout.stack import StackEvaluator

    abandoned: list[int] = []
    monkeypatch.setattr(MemoryCursor, "load_version", lambda self: 7)  # published up to 7 before the restart
    monkeypatch.setattr(StackEvaluator, "abandon_open", lambda self: abandoned.append(1), raising=False)
    cfg = build_config({}, overrides=fast_overrides)
    run = EmbeddedRun(cfg, resume=False, log=lambda *a: None)
    try:
        version = run.session.learner.version
    finally:
        run.close()
    assert version == 8 and abandoned == [1]


def test_a_learner_lost_in_the_wait_after_a_due_checkpoint_logs_that_steps_metrics_row_on_resume(fast_overrides):
    cfg = build_config({}, overrides=[*fast_overrides, "run.steps=3", "task.eval_every=1", "run.checkpoint_every=1"])
    run, evaluator = _run(cfg, resume=False, dies_at_call=2)  # step 2's evaluation, its checkpoint written first
    try:
        with pytest.raises(ProcessDied):
            run.train()
    finally:
        run.close()
    assert _steps(cfg.run_dir / "metrics.jsonl") == [1]  # step 2's row was to follow its evaluation
    again, evaluator = _run(cfg, resume=True)
    try:
        again.train()
    finally:
        again.close()
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]  # step 2's from its checkpoint, logged on resume
    assert "eval_greedy_accuracy" not in rows[1] and rows[1]["loss"] == rows[1]["loss"]  # training numbers, no eval
    assert [c["version"] for c in evaluator.calls] == [2, 3] and _steps(cfg.run_dir / "eval.jsonl") == [0, 1, 2, 3]
