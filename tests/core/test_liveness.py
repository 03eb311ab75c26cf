"""The heartbeat thread of a process's main loop (stare/runtime/liveness.py), over a real in-memory run state:
a loop inside long busy work stays listed alive and healthy while its thread uses CPU; one blocked (no CPU)
stays alive but reads unhealthy after stall_s; without the thread a long step reads dead."""

from __future__ import annotations

import threading
import time

from stare.runstate import MemoryRunState, RunSteering
from stare.runtime.liveness import Liveness

DEAD_AFTER_S, BEAT_S, STALL_S = 0.6, 0.1, 1.0


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1


def _learner(state: MemoryRunState):
    (health,) = [r for r in state.roles() if r.role == "learner"]
    return health


def test_a_loop_busy_computing_stays_alive_and_healthy_past_dead_after_s():
    state = MemoryRunState("live", dead_after_s=DEAD_AFTER_S)
    live = Liveness(RunSteering(state, heartbeat_s=BEAT_S), heartbeat_s=BEAT_S, stall_s=STALL_S)
    seen = []
    with live.running():
        with live.busy("training step"):
            for _ in range(6):  # 1.8 s of computing: three times dead_after_s
                _spin(0.3)
                seen.append(_learner(state))
    assert all(h.alive for h in seen)
    assert all(h.info.get("healthy") is True and h.info.get("busy") == "training step" for h in seen[1:])


def test_a_blocked_loop_stays_alive_but_reads_unhealthy_after_stall_s():
    state = MemoryRunState("hung", dead_after_s=DEAD_AFTER_S)
    live = Liveness(RunSteering(state, heartbeat_s=BEAT_S), heartbeat_s=BEAT_S, stall_s=STALL_S)
    with live.running():
        with live.busy("training step"):
            threading.Event().wait(1.6)  # blocked: no CPU, as on a dead peer's collective
            blocked = _learner(state)
        live.tick()
        time.sleep(3 * BEAT_S)
        recovered = _learner(state)
    assert blocked.alive and blocked.info["healthy"] is False
    assert recovered.alive and recovered.info["healthy"] is True


def test_without_the_thread_a_long_step_reads_dead():
    state = MemoryRunState("control", dead_after_s=DEAD_AFTER_S)
    steering = RunSteering(state, heartbeat_s=BEAT_S)
    steering.heartbeat(force=True)  # what `stare train` did: a beat at the step boundaries only
    _spin(1.0)
    assert not _learner(state).alive
