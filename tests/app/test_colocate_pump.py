"""The colocated embedded pump (stare/app/launch/embedded.py `_pump`): one wake of the engine samples
every prompt pending, in batches of prompts_per_step, as the plain pump's batches (an over-sampled
round, data.oversample, is more than one batch; each wake moves the engine's weights and the
learner's optimizer state, so a round must not cost a wake per batch). Stand-ins, no model."""

from __future__ import annotations

import contextlib
import types

from stare.app.launch.embedded import EmbeddedRun


class Prompts:
    def __init__(self, n: int):
        self.n = n

    def backlog(self) -> int:
        return self.n


class Rollout:
    def __init__(self, prompts: Prompts, log: list):
        self.prompts, self.log = prompts, log

    def run_once(self, max_prompts: int) -> int:
        taken = min(max_prompts, self.prompts.n)
        self.prompts.n -= taken
        self.log.append(("sample", taken))
        return taken


class Colocation:
    def __init__(self, log: list):
        self.log = log

    @contextlib.contextmanager
    def awake(self):
        self.log.append("wake")
        yield
        self.log.append("sleep")


NO_LIVENESS = types.SimpleNamespace(busy=lambda what: contextlib.nullcontext())  # the pump marks its work busy


def _run(pending: int, colocated: bool) -> list:
    log: list = []
    prompts = Prompts(pending)
    run = types.SimpleNamespace(
        cfg=types.SimpleNamespace(rollout=types.SimpleNamespace(prompts_per_step=4)),
        transport=types.SimpleNamespace(prompts=prompts),
        rollout=Rollout(prompts, log),
        reward=types.SimpleNamespace(run_once=lambda: log.append("score")),
        colocation=Colocation(log) if colocated else None,
        liveness=NO_LIVENESS,
    )
    EmbeddedRun._pump(run, 1)
    return log


def test_one_wake_samples_an_oversampled_round_in_batches_of_prompts_per_step():
    # 10 pending, prompts_per_step 4: batches of 4, 4, 2 inside one wake, then scoring
    assert _run(10, colocated=True) == ["wake", ("sample", 4), ("sample", 4), ("sample", 2), "sleep", "score"]


def test_nothing_pending_wakes_nothing():
    assert _run(0, colocated=True) == ["score"]


def test_the_plain_pump_samples_one_batch_per_fill_round_as_before():
    assert _run(10, colocated=False) == [("sample", 4), "score"]


def test_a_batch_that_takes_nothing_ends_the_wake():
    # a rollout worker that handles nothing (the prompts are another's pending entries) must not spin
    log: list = []
    prompts = Prompts(3)
    run = types.SimpleNamespace(
        cfg=types.SimpleNamespace(rollout=types.SimpleNamespace(prompts_per_step=4)),
        transport=types.SimpleNamespace(prompts=prompts),
        rollout=types.SimpleNamespace(run_once=lambda max_prompts: log.append("sample") or 0),
        reward=types.SimpleNamespace(run_once=lambda: log.append("score")),
        colocation=Colocation(log),
        liveness=NO_LIVENESS,
    )
    EmbeddedRun._pump(run, 1)
    assert log == ["wake", "sample", "sleep", "score"]
