"""The foreground of every launch target (stare.app.launch.base.Launcher): start, supervise until
the learner finishes or Ctrl-C / SIGTERM, then stop."""

from __future__ import annotations

import signal

from stare.app.launch.base import Launcher


def run_until_done(launcher: Launcher) -> int:
    """start(), supervise() until the learner finishes or Ctrl-C / SIGTERM, then stop(): the
    foreground of `stare up` on every target.

    The signal handler only flips plain attributes (a handler that takes a lock, e.g. Event.set,
    deadlocks when a second signal lands inside the first). A signal during start() aborts it;
    once running, the first Ctrl-C / SIGTERM stops gracefully and a second Ctrl-C makes stop()
    kill what is left at once (`launcher.force_stop`)."""
    flags = {"stop": False, "started": False}

    def on_signal(signum, frame) -> None:
        again = flags["stop"]
        flags["stop"] = True
        if not flags["started"]:
            raise KeyboardInterrupt  # during start (it may wait long, e.g. for Ray resources)
        if again and signum == signal.SIGINT:
            launcher.force_stop = True

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            launcher.start()
            flags["started"] = True
            code = launcher.supervise(until=lambda: flags["stop"])
        except KeyboardInterrupt:
            code = 130
    finally:
        flags["started"] = True  # from here on a signal never raises into stop()
        launcher.stop()
        for s, handler in old.items():
            signal.signal(s, handler)
    stop = flags["stop"]
    if stop:
        launcher.say(
            f"stopped by signal; continue with the same command (the learner resumes from "
            f"{launcher.cfg.run_dir / 'checkpoints'})"
        )
    return code
