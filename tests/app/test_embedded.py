"""End to end: `stare train` in one process, few steps, tiny model, real DeepSpeed on CPU."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from learner.engine.deepspeed_engine import child_env
from stare.app.launch.embedded import run_training
from stare.app.launch.run_folder import prepare_run
from stare.config import build_config

pytestmark = pytest.mark.slow

COMPARED = ("loss", "entropy", "reward_mean", "gate", "w", "m", "clip_fraction", "grad_norm", "response_length_mean")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_train_writes_metrics_eval_checkpoint_tensorboard_and_report(fast_overrides):
    cfg = build_config({}, overrides=fast_overrides)
    run_dir = run_training(prepare_run(cfg, None), progress=False)
    metrics = _lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for key in (
        "reward_mean",
        "accuracy",
        "entropy",
        "target",
        "gate",
        "w",
        "m",
        "response_length_mean",
        "tokens_per_s",
        "time_step_s",
        "weight_version",
        "quadrant/pos_high/fraction",
    ):
        assert key in metrics[-1], key
    assert metrics[-1]["weight_version"] == 2
    evals = _lines(run_dir / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2] and 0.0 <= evals[-1]["pass_at_k"] <= 1.0
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000002"
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert (run_dir / "report" / "report.png").stat().st_size > 10_000
    assert (run_dir / "hf" / "model.safetensors").is_file()  # the end-of-run export (learner/engine/export.py)


def test_resumed_run_reproduces_the_uninterrupted_run(fast_overrides, tmp_path):
    common = fast_overrides + [
        "run.steps=3",
        "controller.adaptive=true",
        "controller.alpha=0.1",
        "controller.target=5.0",
    ]
    straight = run_training(
        prepare_run(build_config({}, overrides=common + ["run.name=straight"]), None), progress=False
    )
    first = run_training(
        prepare_run(build_config({}, overrides=common + ["run.name=split", "run.steps=1"]), None), progress=False
    )
    run_training(prepare_run(None, first, ["run.steps=3"]), resume=True, progress=False)
    # checkpoint_every=1 and keep_checkpoints=2: only the two newest survive
    assert sorted(p.name for p in (straight / "checkpoints").glob("step_*")) == ["step_000002", "step_000003"]
    a, b = _lines(straight / "metrics.jsonl"), _lines(first / "metrics.jsonl")
    assert [m["step"] for m in b] == [1, 2, 3]
    assert [m["gate"] for m in a] == [1, 1, 1]  # target above the entropy: STARE reweights every step
    for ma, mb in zip(a, b):
        for key in COMPARED:
            assert mb[key] == pytest.approx(ma[key], rel=1e-5, abs=1e-7), (ma["step"], key)


def test_sigint_stops_after_the_step_and_leaves_a_resumable_checkpoint(fast_overrides, tmp_path):
    args = [sys.executable, "-m", "stare.app.cli", "train", "--no-progress"]
    for o in fast_overrides + ["run.steps=200", "run.checkpoint_every=1000", "run.name=sig"]:
        args += ["--set", o]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, env=child_env()
    )
    run_dir = Path([o for o in fast_overrides if o.startswith("run.output_dir=")][0].split("=", 1)[1]) / "sig"
    deadline = time.monotonic() + 300
    while not _lines(run_dir / "metrics.jsonl"):
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.monotonic() < deadline, "no step finished in time"
        time.sleep(0.5)
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out.decode()
    steps = [m["step"] for m in _lines(run_dir / "metrics.jsonl")]
    assert len(steps) < 200
    # --no-progress still says how to continue (the one line a stopped run needs)
    assert f"stopped after step {steps[-1]}; resume with: stare train --resume {run_dir}" in out.decode()
    assert (run_dir / "checkpoints" / "latest").read_text() == f"step_{steps[-1]:06d}"
    resumed = run_training(prepare_run(None, run_dir, [f"run.steps={steps[-1] + 1}"]), resume=True, progress=False)
    assert [m["step"] for m in _lines(resumed / "metrics.jsonl")] == steps + [steps[-1] + 1]


def test_dynamic_sampling_samples_more_rounds_until_the_step_is_full(fast_overrides):
    cfg = build_config({}, overrides=fast_overrides + ["data.dynamic_sampling=true", "data.max_sampling_rounds=3"])
    metrics = _lines(run_training(prepare_run(cfg, None), progress=False) / "metrics.jsonl")
    for m in metrics:
        assert 1 <= m["sampling_rounds"] <= 3
        # a step is either full, or it used every round it was allowed
        assert m["groups"] == 2 or m["sampling_rounds"] == 3
        assert m["sampling_rounds"] == 1 or m["filtered_groups"] > 0  # a second round only replaces filtered groups


def test_training_an_existing_run_name_is_refused(fast_overrides):
    from stare.config import ConfigError

    cfg = build_config({}, overrides=fast_overrides + ["run.steps=1"])
    run_training(prepare_run(cfg, None), progress=False)
    with pytest.raises(ConfigError, match="run.name"):
        prepare_run(cfg, None)


def test_an_entropy_source_changed_at_run_time_feeds_the_gate_from_the_next_step(fast_overrides):
    from stare.app.launch.embedded import EmbeddedRun, StopFlag
    from stare.runstate import MemoryRunState, RunSteering

    cfg = prepare_run(build_config({}, overrides=fast_overrides + ["run.name=lagged"]), None)
    assert cfg.controller.entropy_source == "prepass"
    run = EmbeddedRun(cfg, resume=False, log=lambda *_: None)
    state = MemoryRunState("lagged")
    control = RunSteering(state)
    control.start(run.learner.controller)  # publishes the controller, as train() does
    state.request_entropy_change({"entropy_source": "lagged"}, "test")  # applied before step 1
    lagged_after: dict[int, float] = {}
    steps: list[dict] = []

    def on_step(m: dict) -> None:
        steps.append(m)
        lagged_after[m["step"]] = run.learner.lagged_entropy

    try:
        run.train(StopFlag(), on_step, control)
    finally:
        run.close()
    assert steps[0]["entropy_gate_input"] == steps[0]["entropy"]  # nothing lagged yet at step 1
    assert steps[1]["entropy_gate_input"] == lagged_after[1] != steps[1]["entropy"]


def test_a_stop_during_a_sampling_round_takes_effect_between_steps_and_the_run_resumes(fast_overrides):
    """In process, what a step has collected lives only in memory: a stop asked for in the middle of a
    step's sampling rounds must not checkpoint a cursor past groups that die with the process."""
    import json

    from stare.app.launch.embedded import EmbeddedRun, StopFlag

    # 2 samples a group: about half the groups have equal rewards and are filtered, so a step's first
    # round rarely fills it
    overrides = fast_overrides + [
        "run.name=midstep",
        "run.steps=3",
        "data.dynamic_sampling=true",
        "data.max_sampling_rounds=3",
        "rollout.prompts_per_step=4",
        "rollout.samples_per_prompt=2",
    ]
    cfg = prepare_run(build_config({}, overrides=overrides), None)
    run = EmbeddedRun(cfg, resume=False, log=lambda *_: None)
    stop, pumps = StopFlag(), []
    pump = run.session.seams.pump

    def pump_then_stop(fill_round: int) -> None:
        pump(fill_round)
        pumps.append((run.learner.step, fill_round))
        if run.learner.step == 1:
            stop.requested = True  # in the first round of step 2: step 2 still completes

    run.session.seams.pump = pump_then_stop
    try:
        run.train(stop)
    finally:
        run.close()
    # step 2's sampling went on after the stop: more rounds, or the step trained (old code: stopped at once)
    assert (1, 1) in pumps and ((1, 2) in pumps or run.learner.step == 2)
    tag = (cfg.run_dir / "checkpoints" / "latest").read_text()
    state = json.loads((cfg.run_dir / "checkpoints" / tag / "trainer_state.json").read_text())
    finished = state["collector"]["finished"]
    # every group the checkpoint's cursor counts is finished: none was left half-collected in memory
    assert state["data"]["cursor"] == finished["watermark"] + len(finished["above"]) + len(finished["other"])
    resumed = prepare_run(None, cfg.run_dir, [])
    run_training(resumed, resume=True, progress=False)  # hung before: a cursor past groups that died
    assert [m["step"] for m in _lines(cfg.run_dir / "metrics.jsonl")] == [1, 2, 3]


def test_a_checkpoint_of_stare_train_from_before_the_shared_loop_resumes(fast_overrides):
    """Those checkpoints have no collector (nor, in `stare learner`'s, RNG) state: every group up to
    the saved cursor counts as finished."""
    import json

    cfg = prepare_run(build_config({}, overrides=fast_overrides + ["run.name=old", "run.steps=1"]), None)
    run_training(cfg, progress=False)
    state_file = cfg.run_dir / "checkpoints" / "step_000001" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    del state["collector"]
    state_file.write_text(json.dumps(state))
    (state_file.parent / "manifest.json").unlink()  # nor a manifest (learner.engine.checkpoints: resumed as before)
    run_training(prepare_run(None, cfg.run_dir, ["run.steps=2"]), resume=True, progress=False)
    assert [m["step"] for m in _lines(cfg.run_dir / "metrics.jsonl")] == [1, 2]
