"""`stare train` with the engine colocated (system.colocate on, on CPU with the transformers engine):
the engine sleeps before the learner is built and during every learner step, wakes with the
newest weights for every sampling and evaluation, the learner's optimizer state is offloaded
(DeepSpeed's offload_states) exactly while the engine is awake, and the run's numbers are those
of the same run without colocation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stare.app.launch.embedded import run_training
from stare.app.launch.run_folder import prepare_run
from stare.config import build_config

pytestmark = pytest.mark.slow

COMPARED = (
    "loss",
    "entropy",
    "reward_mean",
    "gate",
    "w",
    "m",
    "clip_fraction",
    "grad_norm",
    "response_length_mean",
    "weight_version",
    "train_tokens",
)


class Recording:
    """A rollout engine that logs every call, and the state of the engine at it, into `log`."""

    def __init__(self, engine, log: list):
        self._engine, self._log = engine, log

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def generate(self, prompts, params):
        self._log.append(("generate", self._engine.asleep, self._engine.weight_version, _offloaded()))
        return self._engine.generate(prompts, params)

    def update_weights(self, state, version):
        self._log.append(("update", self._engine.asleep, version, _offloaded()))
        return self._engine.update_weights(state, version)

    def sleep(self):
        self._log.append(("sleep",))
        return self._engine.sleep()

    def wake(self):
        self._log.append(("wake",))
        return self._engine.wake()


LEARNERS: list = []  # the learner of the run under test (what is offloaded is read from it)


def _offloaded() -> frozenset:
    from learner.engine.deepspeed_engine import offloaded_states

    return offloaded_states(LEARNERS[-1].engine) if LEARNERS else frozenset()


@pytest.fixture
def recorded(monkeypatch):
    """Every engine call and learner step of the runs in the test, in order."""
    import learner.step.trainer as trainer
    import rollout.stack as stack
    import stare.app.launch.embedded as embedded

    class Wired(embedded.EmbeddedRun):  # the learner sees the engine it shares the GPU with (for the log)
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.learner._test_engine = self.stack.engine

    monkeypatch.setattr(embedded, "EmbeddedRun", Wired)

    log: list = []
    build = stack.build_engine
    monkeypatch.setattr(stack, "build_engine", lambda config: Recording(build(config), log))
    init, step = trainer.Learner.__init__, trainer.Learner.train_step

    def record_init(self, *args, **kwargs):
        log.append(("learner built",))
        init(self, *args, **kwargs)
        LEARNERS.append(self)

    def record_step(self, trajectories):
        engine = self._test_engine
        log.append(("step", engine.asleep, self.version, _offloaded()))
        out = step(self, trajectories)
        log.append(("stepped", engine.asleep, self.version, _offloaded()))
        return out

    monkeypatch.setattr(trainer.Learner, "__init__", record_init)
    monkeypatch.setattr(trainer.Learner, "train_step", record_step)
    yield log
    LEARNERS.clear()


def _train(overrides: list[str], name: str) -> Path:
    cfg = build_config({}, overrides=overrides + [f"run.name={name}", "control_plane.serve_in_train=false"])
    return run_training(prepare_run(cfg, None), progress=False)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_colocated_run_sleeps_through_every_step_and_samples_awake_with_the_newest_weights(fast_overrides, recorded):
    common = fast_overrides + ["run.steps=3", "task.eval_every=2"]
    run_dir = _train(common + ["system.colocate=on", "system.colocate_offload=optimizer"], "colo")
    log = recorded
    assert log[0][0] == "sleep" and log[1] == ("learner built",)  # asleep before the learner takes its memory
    steps = [e for e in log if e[0] == "step"]
    generates = [e for e in log if e[0] == "generate"]
    assert len(steps) == 3 and len(generates) >= 3 + 3  # a step's sampling each, evaluations at 0, 2, 3
    offloaded = {"optim_states", "hp_params", "lp_grads"}
    for _, asleep, _, moved in steps + [e for e in log if e[0] == "stepped"]:
        assert asleep and not moved  # the learner steps with the engine asleep and its own state back
    version = 0
    for event in log:  # each sampling: awake, with the weights the learner has now, its state offloaded
        if event[0] == "stepped":
            version = event[2]
        if event[0] == "generate":
            assert event[1] is False and event[2] == version and event[3] == offloaded, event
    # every wake is followed by the newest weights (when there are new ones) before any sampling, and a sleep
    kinds = [e[0] for e in log]
    assert kinds.count("wake") == kinds.count("sleep") - 1  # the first sleep came without a wake
    assert [e[2] for e in log if e[0] == "update"] == [1, 2, 3]
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000003"


def test_colocation_does_not_change_the_numbers(fast_overrides, recorded):
    common = fast_overrides + ["run.steps=3", "task.eval_every=2"]
    plain = _train(common + ["system.colocate=off"], "plain")
    assert not any(e[0] in ("sleep", "wake") for e in recorded)  # off: the engine never sleeps
    colo = _train(common + ["system.colocate=on", "system.colocate_offload=optimizer"], "colo")
    a, b = _lines(plain / "metrics.jsonl"), _lines(colo / "metrics.jsonl")
    assert [m["step"] for m in a] == [m["step"] for m in b] == [1, 2, 3]
    for ma, mb in zip(a, b):
        for key in COMPARED:
            assert mb[key] == ma[key], (ma["step"], key)  # exactly: sleeping keeps every bit
    ea, eb = _lines(plain / "eval.jsonl"), _lines(colo / "eval.jsonl")
    drop = ("time_s", "time_unix")
    assert [{k: v for k, v in e.items() if k not in drop} for e in ea] == [
        {k: v for k, v in e.items() if k not in drop} for e in eb
    ]
