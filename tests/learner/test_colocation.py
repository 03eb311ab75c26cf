"""The node-colocated learner's pieces on rank 0 (learner/process/colocation.py), with stand-ins for the ranks:
when the pump sends a SAMPLE op and what it asks for (each rank's share, whether the ZeRO-3 gather runs),
the step guard, and weights that are gathered only when read. The whole mode against `stare train`:
tests/system/test_modes_agree.py."""

from __future__ import annotations

import contextlib

import pytest

from learner.process.colocation import SAMPLE, DeferredPublish, InProcessPublisher, SamplePump, TrainsAsleep


class Prompts:
    def __init__(self, waiting: int):
        self.waiting = waiting

    def backlog(self) -> int:
        return self.waiting


class Ranks:
    """A LeaderLearner stand-in: records each op; each rank reports the engine version `behind` says."""

    def __init__(self, world: int, prompts: Prompts):
        self.version, self.world, self.prompts, self.ops = 0, world, prompts, []
        self.behind: set[int] = set()  # ranks whose engine stays on the version before
        self.take = True

    def run_op(self, op, args, local):
        self.ops.append((op, *args))
        version, share, _ = args
        taken = min(share, self.prompts.waiting) if self.take else 0
        self.prompts.waiting -= taken
        return [
            {
                "rank": r,
                "prompts": taken if r == 0 else 0,
                "engine_version": version - 1 if r in self.behind else version,
            }
            for r in range(self.world)
        ]


def _pump(world=4, waiting=10, collective=True, retry_s=60.0):
    prompts = Prompts(waiting)
    ranks = Ranks(world, prompts)
    pump = SamplePump(
        ranks,
        rollout=None,
        prompts=prompts,
        world=world,
        collective=collective,
        busy=lambda what: contextlib.nullcontext(),
        retry_s=retry_s,
        say=lambda line: None,
    )
    return pump, ranks, prompts


def test_no_op_and_no_wake_when_nothing_waits():
    pump, ranks, prompts = _pump(waiting=0)
    pump(1)
    assert ranks.ops == []


def test_each_rank_takes_its_share_and_the_zero3_gather_runs_once_per_version():
    pump, ranks, prompts = _pump(world=4, waiting=10)
    pump(1)  # 10 waiting over 4 ranks: 3 at a time each; the first op gathers (nothing is known of the engines)
    assert ranks.ops == [(SAMPLE, 0, 3, True)]
    prompts.waiting = 5  # a second round at the same version: every engine has it, no collective gather
    pump(2)
    assert ranks.ops[-1] == (SAMPLE, 0, 2, False)
    ranks.version, prompts.waiting = 1, 4  # a step later: new weights, gathered on every rank
    pump(1)
    assert ranks.ops[-1] == (SAMPLE, 1, 1, True)


def test_an_engine_left_behind_makes_the_next_op_gather_again():
    pump, ranks, prompts = _pump(world=2, waiting=4)
    ranks.behind = {1}  # rank 1 took nothing, so it did not load the version
    pump(1)
    prompts.waiting, ranks.behind = 2, set()
    pump(2)
    assert [op[-1] for op in ranks.ops] == [True, True]


def test_below_zero3_no_op_asks_for_a_gather():
    pump, ranks, _ = _pump(collective=False)
    pump(1)
    assert ranks.ops == [(SAMPLE, 0, 3, False)]


def test_an_op_that_took_nothing_is_not_repeated_before_the_retry_time(monkeypatch):
    import learner.process.colocation as colocation

    now = [100.0]
    monkeypatch.setattr(colocation.time, "monotonic", lambda: now[0])
    pump, ranks, prompts = _pump(waiting=3, retry_s=15.0)
    ranks.take = False  # pending on a consumer that is gone: nobody can take them before claim_idle_s
    pump(1)
    pump(2)
    assert len(ranks.ops) == 1
    now[0] += 15.0
    pump(3)
    assert len(ranks.ops) == 2


class Engine:
    def __init__(self, asleep: bool):
        self.awake = not asleep

    def asleep(self) -> bool:
        return not self.awake


class Learner:
    def __init__(self):
        self.step, self.reads = 0, 0

    def train_step(self, trajectories):
        self.step += 1
        return {"step": self.step}

    def state_dict_for_rollout(self):
        self.reads += 1
        return {"w": self.reads}


def test_a_step_with_the_engine_awake_is_refused_and_steps_asleep_are_counted():
    learner = Learner()
    guarded = TrainsAsleep(learner, Engine(asleep=True))
    guarded.train_step([])
    guarded.version = 3  # attributes go through to the learner
    assert guarded.steps_asleep == 1 and learner.version == 3
    with pytest.raises(RuntimeError, match="rollout engine awake"):
        TrainsAsleep(learner, Engine(asleep=False)).train_step([])
    assert learner.step == 1


def test_the_session_publishes_nothing_until_something_reads_the_weights():
    learner = Learner()
    state = DeferredPublish(learner).state_dict_for_rollout()
    publisher = InProcessPublisher()
    publisher.publish(1, state)
    assert learner.reads == 0 and publisher.version == 1 and not hasattr(publisher, "_state")
    assert dict(state) == {"w": 1} and state["w"] == 1 and learner.reads == 1  # gathered once, when read
