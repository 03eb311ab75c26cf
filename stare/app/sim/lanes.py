"""A `Lane`: one GPU group's timeline in `stare sim` (a rollout engine's, the learner's): its clock and what
it did when, for the busy fractions and the Gantt chart."""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("decode", "prefill", "train", "send/receive", "checkpoint")


@dataclass
class Lane:
    """A set of GPUs acting together (a rollout engine's, the learner's): its clock and its intervals."""

    name: str
    gpus: list[int]
    now: float = 0.0
    intervals: list[tuple[float, float, str]] = field(default_factory=list)

    def busy(self, seconds: float, kind: str) -> None:
        """Work of `kind` from now on; the clock moves past it (adjacent intervals of a kind merge)."""
        if seconds <= 0:
            return
        start, end = self.now, self.now + seconds
        if self.intervals and self.intervals[-1][2] == kind and abs(self.intervals[-1][1] - start) < 1e-12:
            start = self.intervals[-1][0]
            self.intervals[-1] = (start, end, kind)
        else:
            self.intervals.append((start, end, kind))
        self.now = end

    def wait_until(self, t: float) -> None:
        self.now = max(self.now, t)

    def busy_in(self, t0: float, t1: float) -> dict[str, float]:
        """Seconds of each kind inside [t0, t1]."""
        out = dict.fromkeys(KINDS, 0.0)
        for a, b, kind in self.intervals:
            out[kind] += max(0.0, min(b, t1) - max(a, t0))
        return out
