"""RunSteering, the learner's adapter: changes apply before the step with reconfigure, show in that
step's metrics, and a change that no longer validates is recorded, not raised."""

from __future__ import annotations

from control_helpers import started

from learner.algorithm.entropy_controller import EntropyController
from stare.config.algo import ControllerConfig
from stare.runstate import MemoryRunState, RunSteering


def test_before_step_applies_pending_changes_to_the_controller(controller):
    state = MemoryRunState("run")
    control = started(state, controller)
    state.request_entropy_change({"target": 0.5}, "a")
    state.request_entropy_change({"band": [0.4, 0.6]}, "b")
    directives = control.before_step(controller)
    assert [e.id for e in directives.applied] == [1, 2]
    assert (controller.target, controller.band) == (0.5, (0.4, 0.6))
    assert state.controller()["config"]["target"] == 0.5  # republished at once


def test_after_step_reports_the_applied_changes_in_that_step_s_metrics(controller):
    state = MemoryRunState("run")
    control = started(state, controller)
    state.request_entropy_change({"target": 0.5}, "a")
    control.before_step(controller)
    metrics = control.after_step(controller, {"step": 1, "target": controller.target}, {"tokens_per_s": 10.0})
    assert (metrics["control_changes"], metrics["control_audit_ids"]) == (1, [1])
    assert state.metrics_page().items[-1]["control_changes"] == 1
    assert [e.applied_step for e in state.audit()] == [1]
    control.before_step(controller)
    assert control.after_step(controller, {"step": 2})["control_changes"] == 0  # reported once
    assert (state.status()["step"], state.status()["phase"]) == (2, "training")


def test_a_change_that_no_longer_validates_is_recorded_and_skipped():
    controller = EntropyController(ControllerConfig(w=1.1, w_max=1.5))
    state = MemoryRunState("run")
    control = started(state, controller)
    state.request_entropy_change({"w": 1.4}, "a")  # valid against w_max 1.5 ...
    controller.reconfigure(w_max=1.2)  # ... but the learner's bound moved meanwhile
    directives = control.before_step(controller)
    assert directives.applied == [] and controller.w <= 1.2
    assert state.audit()[0].error.startswith("not applied")


def test_directives_carry_pause_and_a_checkpoint_request_once(controller):
    state = MemoryRunState("run")
    control = started(state, controller)
    state.set_paused(True)
    state.request_checkpoint()
    first, second = control.before_step(controller), control.before_step(controller)
    assert (first.paused, first.checkpoint, second.paused, second.checkpoint) == (True, True, True, False)


def test_heartbeats_are_rate_limited_to_heartbeat_s(controller):
    state = MemoryRunState("run")
    control = RunSteering(state, heartbeat_s=3600)
    control.heartbeat(info={"n": 1})
    control.heartbeat(info={"n": 2})  # within heartbeat_s: skipped
    assert [r.info for r in state.roles()] == [{"n": 1}]


def _train(control: RunSteering, controller, steps: int) -> None:
    for _ in range(steps):
        step = (control._step or 0) + 1
        control.before_step(controller)
        control.after_step(controller, {"step": step})


def test_a_resumed_learner_applies_again_each_change_made_after_its_checkpoint_at_its_step(make_state):
    state = make_state()
    first = EntropyController(ControllerConfig(target=0.3))
    control = started(state, first)
    _train(control, first, 2)  # the checkpoint: step 2, target 0.3
    state.request_entropy_change({"target": 0.5}, "a")
    _train(control, first, 2)  # applied at step 3
    state.request_entropy_change({"band": [0.45, 0.6]}, "b")
    _train(control, first, 1)  # applied at step 5; the learner dies here, before its next checkpoint
    restored = EntropyController(ControllerConfig(target=0.3))  # what the step-2 checkpoint holds
    again = RunSteering(state)
    again.start(restored, 2, resumed=True)
    assert again.before_step(restored).applied[0].id == 1 and restored.target == 0.5  # before step 3
    again.after_step(restored, {"step": 3})
    assert again.before_step(restored).applied == [] and restored.band != (0.45, 0.6)  # step 4 ran without it
    again.after_step(restored, {"step": 4})
    assert [e.id for e in again.before_step(restored).applied] == [2] and restored.band == (0.45, 0.6)
    assert [(e.applied_step, e.error) for e in state.audit()] == [(3, None), (5, None)]  # kept, not re-recorded
    assert state.controller()["config"]["band"] == [0.45, 0.6]


def test_changes_the_checkpoint_holds_or_a_fresh_start_are_not_applied_again(make_state):
    state = make_state()
    controller = EntropyController(ControllerConfig(target=0.3))
    control = started(state, controller)
    state.request_entropy_change({"target": 0.5}, "a")
    _train(control, controller, 3)  # applied at step 1; a checkpoint at step 3 holds it
    at_checkpoint = EntropyController(ControllerConfig(target=0.3))
    RunSteering(state).start(at_checkpoint, 3, resumed=True)
    fresh = EntropyController(ControllerConfig(target=0.3))
    restarted = RunSteering(state)
    restarted.start(fresh, 0)  # not resumed: a new run under the same id replays nothing
    assert restarted.before_step(fresh).applied == [] and fresh.target == 0.3


def test_a_replayed_change_that_no_longer_validates_is_skipped_and_not_reported(make_state):
    state = make_state()
    first = EntropyController(ControllerConfig(w=1.1, w_max=2.0))
    control = started(state, first)
    state.request_entropy_change({"w": 1.8}, "a")
    _train(control, first, 1)  # applied at step 1; no checkpoint holds it
    restored = EntropyController(ControllerConfig(w=1.1, w_max=1.5))  # resumed under a lower bound
    again = RunSteering(state)
    again.start(restored, 0, resumed=True)
    assert again.before_step(restored).applied == [] and restored.w <= 1.5
    assert again.after_step(restored, {"step": 1})["control_changes"] == 0
