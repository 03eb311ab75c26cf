"""How a training session ended, and why a run that trained nothing is not a success.

    finished   run.steps reached
    stopped    a stop request (Ctrl-C, SIGTERM, the control plane): resumable
    no_input   every group of a step's sampling rounds was dead-lettered (a prompt refused by
               data.prompt_overflow=reject, a token outside the vocabulary, a worker that keeps
               failing): the reasons, counted by rule, say which setting admits them
    no_signal  MAX_EMPTY_STEPS steps in a row without a group whose rewards differ (the task is solved
               or unsolvable for this policy): the measured fraction of equal-reward groups

The last two are failures: `stare train` and `stare learner` exit non-zero with the message.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

MAX_EMPTY_STEPS = 20  # on-policy: steps in a row without a trainable group before giving up
FAILED = ("no_input", "no_signal")


def rule_of(reason: str) -> str:
    """A dead-letter reason with its numbers taken out: the rule that refused the entry."""
    return re.sub(r"\d+", "N", reason)


class NothingTrained(RuntimeError):
    """The run ended without a success: nothing to train on, or no reward signal (the message says why)."""


@dataclass
class EmptySteps:
    """The streak of steps whose sampling rounds ended with no trainable group."""

    steps: int = 0
    filtered: int = 0  # groups with equal rewards (dynamic sampling dropped them)
    dead: int = 0  # groups closed because an entry of theirs was dead-lettered
    reasons: Counter = field(default_factory=Counter)  # rule -> groups
    example: dict = field(default_factory=dict)  # rule -> one full reason

    def add(self, filtered: int, dead: int, reasons: list[str]) -> str | None:
        """One more empty step (`filtered`/`dead`: its groups; `reasons`: its dead letters'); the
        outcome when the run should stop, else None."""
        self.steps += 1
        self.filtered += filtered
        self.dead += dead
        for reason in reasons:
            self.reasons[rule_of(reason)] += 1
            self.example.setdefault(rule_of(reason), reason)
        if dead and not filtered:
            return "no_input"
        return "no_signal" if self.steps >= MAX_EMPTY_STEPS else None

    def message(self, outcome: str) -> str:
        if outcome == "no_input":
            rules = (
                "; ".join(f"{n} by: {self.example[r]}" for r, n in self.reasons.most_common(3)) or "no reason recorded"
            )
            return (
                f"no input to train on: all {self.dead} groups of the last {self.steps} step(s) were dead-lettered "
                f"({sum(self.reasons.values())} entries refused; {rules})"
            )
        groups = self.filtered + self.dead
        fraction = self.filtered / groups if groups else 1.0
        return (
            f"no reward signal for {self.steps} steps in a row: {fraction:.0%} of the {groups} groups sampled had "
            f"equal rewards (the task is solved or unsolvable for this policy); lower task difficulty, raise "
            f"rollout.samples_per_prompt or data.max_sampling_rounds, or check the reward"
        )


@dataclass
class RunOutcome:
    outcome: str  # finished | stopped | no_input | no_signal
    trained_steps: int  # steps this session trained
    message: str | None = None

    @property
    def failed(self) -> bool:
        return self.outcome in FAILED
