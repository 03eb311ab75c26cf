"""call_with_timeout: interrupts Python code on any thread, leaves fast calls alone."""

import threading
import time

import pytest

from stare.runtime.timeouts import VerifierTimeout, call_with_timeout


def _spin(seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "done"


def _swallowing_spin() -> str:
    end = time.monotonic() + 3
    while time.monotonic() < end:
        try:
            while True:
                pass
        except Exception:  # a verifier that eats every Exception must still be stopped
            pass
    return "not stopped"


def test_fast_call_returns_its_value():
    assert call_with_timeout(_spin, 2.0, 0.01) == "done"


def test_slow_call_times_out_on_the_main_thread():
    with pytest.raises(VerifierTimeout):
        call_with_timeout(_spin, 0.1, 5)


def test_slow_call_times_out_on_a_worker_thread():
    out = []

    def run():
        try:
            call_with_timeout(_spin, 0.1, 5)
        except VerifierTimeout:
            out.append("timeout")

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(5)
    assert out == ["timeout"]


def test_except_exception_does_not_swallow_the_timeout():
    with pytest.raises(VerifierTimeout):
        call_with_timeout(_swallowing_spin, 0.1)


def test_outer_timeout_wins_over_a_longer_inner_one():
    start = time.monotonic()
    with pytest.raises(VerifierTimeout, match="0.2"):
        call_with_timeout(call_with_timeout, 0.2, _spin, 10, 5)
    assert time.monotonic() - start < 2


def test_no_stray_interrupt_after_a_call_that_finished():
    call_with_timeout(_spin, 0.05, 0.04)
    _spin(0.2)  # a late interrupt would land here
