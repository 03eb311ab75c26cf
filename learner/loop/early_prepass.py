"""The learner's pre-pass ahead of a step, run by the session while the step waits for data
(`optim.prepass_early`).

The weights do not change before the step, so the step uses these values instead of computing them
(on-policy the learner would otherwise idle through the whole sampling round): each call prepares the
ready groups the step would take now (`GroupCollector.upcoming`) that are not prepared at the current
weights yet, at most a step's worth, so the loop stays responsive. What was prepared at older weights is
forgotten (the learner's store drops it too: learner/step/prepass_store.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any


class EarlyPrepass:
    def __init__(self, cfg: Any, learner: Any, collector: Any, busy: Callable[[str], AbstractContextManager[Any]]):
        self.cfg, self.learner, self.collector, self.busy = cfg, learner, collector, busy
        self.prepared: set[str] = set()  # group ids prepared at weight version `at`
        self.at: int | None = None
        self.seconds, self.groups = 0.0, 0  # since the last step (its metrics)

    def run(self, whole_rounds: bool) -> None:
        learner = self.learner
        if not self.cfg.optim.prepass_early or not getattr(learner, "needs_prepass", True):
            return  # off, or STARE's selection keyed on the rollout's log-probs: no pre-pass to run ahead
        if self.at != learner.version:  # the weights moved on: what was prepared is not used
            self.prepared, self.at = set(), learner.version
        groups = [
            g
            for g in self.collector.upcoming(self.cfg.rollout.prompts_per_step, whole_rounds)
            if g[0].group_id not in self.prepared
        ]
        if not groups:
            return
        t0 = time.perf_counter()
        with self.busy("preparing the next step"):
            learner.prepare([t for g in groups for t in g])
        self.prepared.update(g[0].group_id for g in groups)
        self.seconds += time.perf_counter() - t0
        self.groups += len(groups)

    def new_step(self) -> None:
        self.seconds, self.groups = 0.0, 0
