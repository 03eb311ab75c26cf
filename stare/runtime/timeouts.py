"""A per-call timeout for verifiers that works on any thread, not just the main one.

`call_with_timeout(fn, timeout_s, ...)` runs `fn` in the calling thread; a timer thread raises an
exception inside it when time is up (`PyThreadState_SetAsyncExc`), which the call turns into
`VerifierTimeout`. Unlike `signal.alarm` (what math-verify uses, main thread only), this works in
worker threads and event-loop executors.

Limits: the exception is delivered between Python bytecodes, so a long C call (a catastrophic
regex, a huge integer power, `time.sleep`) is interrupted only when it returns; the interrupted
code gets no chance to clean up beyond its `finally` blocks. Where a hard bound matters, run the
verifier in `ScoringPool`, whose per-item timeout kills the worker process.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")


class VerifierTimeout(TimeoutError):
    """A verifier ran past its time budget."""


class _Interrupt(BaseException):
    """Injected into the timed thread; a BaseException so `except Exception` does not eat it."""


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


def call_with_timeout(fn: Callable[P, T], timeout_s: float, /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)`, or `VerifierTimeout` if it runs longer than `timeout_s` seconds."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    interrupt: type[_Interrupt] = type("_Interrupt", (_Interrupt,), {})  # one class per call: nesting is safe
    thread_id = threading.get_ident()
    done = threading.Event()
    fired = threading.Event()

    def fire() -> None:
        if not done.is_set():
            fired.set()
            _set_async_exc(thread_id, interrupt)

    timer = threading.Timer(timeout_s, fire)
    timer.daemon = True
    try:
        timer.start()
        try:
            return fn(*args, **kwargs)
        finally:
            done.set()
            timer.cancel()
            timer.join()
            if fired.is_set():
                _set_async_exc(thread_id, None)  # drop it if it has not landed yet
    except interrupt:
        raise VerifierTimeout(f"timed out after {timeout_s:g} s") from None
