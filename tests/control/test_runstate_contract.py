"""The RunState contract: the in-memory and the Redis store behave the same (each test runs on both)."""

from __future__ import annotations

import math
import threading
import time

import pytest
from control_helpers import started

from stare.runstate import EntropyChangeError, Heartbeat, NoControllerError


def test_a_role_is_alive_while_its_last_beat_is_newer_than_dead_after(make_state):
    state = make_state(dead_after_s=15.0)
    state.beat(Heartbeat(role="rollout", name="r0", pid=1, host="h", info={"batches": 3}))
    state.beat(Heartbeat(role="reward", name="w0", pid=2, host="h", at=time.time() - 60))
    roles = {r.name: r for r in state.roles()}
    assert (roles["r0"].alive, roles["w0"].alive) == (True, False)
    assert roles["r0"].info == {"batches": 3} and roles["w0"].age_s >= 60


def test_a_new_beat_replaces_the_role_s_previous_one(make_state):
    state = make_state()
    state.beat(Heartbeat(role="rollout", name="r0", pid=1, host="h", at=time.time() - 60))
    state.beat(Heartbeat(role="rollout", name="r0", pid=7, host="h"))
    assert [(r.pid, r.alive) for r in state.roles()] == [(7, True)]


def test_status_is_none_until_written_then_reads_back(make_state):
    state = make_state()
    assert state.status() is None
    state.set_status({"phase": "training", "step": 3, "queue_depths": {"raw": 2}})
    assert state.status() == {"phase": "training", "step": 3, "queue_depths": {"raw": 2}}


def test_non_finite_floats_are_stored_as_null(make_state):
    state = make_state()
    state.append_metrics({"step": 1, "loss": math.nan, "x": [math.inf, 1.0]})
    assert state.metrics_page().items == [{"step": 1, "loss": None, "x": [None, 1.0]}]


def test_metrics_pages_use_absolute_indexes(make_state):
    state = make_state()
    assert [state.append_metrics({"step": s}) for s in range(1, 6)] == [0, 1, 2, 3, 4]
    page = state.metrics_page(1, 2)
    assert ([m["step"] for m in page.items], page.offset, page.next, page.total) == ([2, 3], 1, 3, 5)
    tail = state.metrics_page(-2, 10)  # negative offset: from the end
    assert ([m["step"] for m in tail.items], tail.offset, tail.next) == ([4, 5], 3, 5)
    assert state.metrics_page(5, 10).items == []  # "since the last one": nothing new


def test_metrics_history_is_bounded_and_pages_clamp_to_the_oldest_kept(make_state):
    state = make_state(max_metrics=3)
    for s in range(1, 6):
        state.append_metrics({"step": s})
    page = state.metrics_page(0, 10)
    assert ([m["step"] for m in page.items], page.first, page.offset, page.total) == ([3, 4, 5], 2, 2, 5)


def test_an_entropy_change_needs_a_published_controller(make_state):
    with pytest.raises(NoControllerError, match="learner publishes it"):
        make_state().request_entropy_change({"target": 0.4}, "me")


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"target": 0.0}, "target"),
        ({"band": [0.5, 0.2]}, "band"),  # low > high
        ({"band": [0.35, 0.5]}, "band"),  # target 0.3 outside the band
        ({"w": 2.0}, "w"),  # above w_max 1.5
        ({"m": 0.1}, "m"),  # below m_min 0.5
        ({"bogus": 1.0}, "bogus"),  # not a controller field
        ({}, "body"),
    ],
)
def test_an_invalid_change_names_its_field_and_is_not_queued(make_state, controller, changes, field):
    state = make_state()
    started(state, controller)
    with pytest.raises(EntropyChangeError) as err:
        state.request_entropy_change(changes, "me")
    assert err.value.field == field
    assert state.pending_entropy_changes() == [] and state.audit() == []


def test_a_change_is_validated_against_the_pending_ones(make_state, controller):
    state = make_state()
    started(state, controller)
    state.request_entropy_change({"target": 0.5}, "a")
    entry = state.request_entropy_change({"band": [0.4, 0.6]}, "b")  # needs target 0.5 inside the band
    assert (entry.id, entry.old, entry.new) == (2, {"band": None}, {"band": [0.4, 0.6]})


def test_the_audit_records_who_old_new_and_the_applied_step(make_state, controller):
    state = make_state()
    started(state, controller)
    state.request_entropy_change({"target": 0.4}, "alice")
    taken = state.take_entropy_changes()
    assert [(e.who, e.old, e.new) for e in taken] == [("alice", {"target": 0.3}, {"target": 0.4})]
    assert state.take_entropy_changes() == []  # taken once
    state.record_applied([taken[0].id], step=7)
    assert [(e.id, e.applied_step, e.error) for e in state.audit()] == [(1, 7, None)]


def test_the_audit_is_bounded(make_state, controller):
    state = make_state(max_audit=2)
    started(state, controller)
    for target in (0.4, 0.5, 0.6):
        state.request_entropy_change({"target": target}, "me")
    assert [e.new["target"] for e in state.audit()] == [0.5, 0.6]


def test_pause_flag_and_a_checkpoint_request_taken_once(make_state):
    state = make_state()
    assert (state.paused(), state.checkpoint_requested()) == (False, False)
    state.set_paused(True)
    state.request_checkpoint()
    assert (state.paused(), state.checkpoint_requested()) == (True, True)
    assert (state.take_checkpoint_request(), state.take_checkpoint_request()) == (True, False)
    state.set_paused(False)
    assert state.paused() is False


def test_concurrent_changes_get_distinct_ids(make_state, controller):
    state = make_state()
    started(state, controller)
    ids: list[int] = []
    threads = [
        threading.Thread(target=lambda t=t: ids.append(state.request_entropy_change({"target": t}, "x").id))
        for t in (0.31, 0.32, 0.33, 0.34)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(ids) == [1, 2, 3, 4] and len(state.pending_entropy_changes()) == 4


def test_w_and_m_not_given_are_clipped_into_bounds_as_reconfigure_does(make_state):
    from learner.algorithm.entropy_controller import EntropyController
    from stare.config.algo import ControllerConfig

    controller = EntropyController(ControllerConfig(m_min=0.1, m=0.1))
    controller.m = 1 - 1 * (1 - 0.1)  # 0.09999999999999998: a schedule's float error below m_min
    state = make_state()
    started(state, controller)
    assert state.request_entropy_change({"target": 0.5}, "me").new == {"target": 0.5}
