"""`data.oversample` (and which groups the session prepares while a step waits, `optim.prepass_early`):
the real TrainingSession over in-memory streams, with a pump that plays the rollout and reward workers
(each group's rewards fixed by its ordinal, its results sent in the reverse of the publish order, so
that "first to finish" and "first published" differ).

On-policy an over-sampled round publishes ceil(missing x oversample) groups, the step waits for the
whole round and trains exactly prompts_per_step groups, the first trainable ones in publish order;
the rest are dropped and counted, never trained later. Off-policy the window grows by the factor.
The default (1.0) asks each round for exactly the missing groups, as before."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from learner.loop.group_collector import GroupCollector, MemoryDecisionLog
from learner.loop.session import MemoryCursor, SessionSeams, TrainingSession
from stare.app.sim.task import SimTask, SimTokenizer
from stare.config import build_config
from stare.data.feeder import PromptFeeder
from stare.runstate import MemoryRunState, RunSteering
from stare.transport.in_memory import MemoryTransport
from stare.transport.records import Trajectory
from stare.weight_sync.in_memory import MemoryWeightBoard

FILTERED = {2, 5}  # ordinals whose two samples get equal rewards (dynamic sampling drops them)


class FakeLearner:
    def __init__(self, cfg):
        from learner.algorithm.entropy_controller import EntropyController

        self.controller = EntropyController(cfg.controller, max_entropy=10.0)
        self.step = self.version = 0
        self.batches: list[list[str]] = []  # group ids of each step, in the order trained
        self.prepared: list[tuple[int, list[str]]] = []  # (version, group ids) of each prepare call

    def train_step(self, trajectories):
        self.batches.append(list(dict.fromkeys(t.group_id for t in trajectories)))
        self.step += 1
        self.version += 1
        c = self.controller
        return {
            "step": self.step,
            "weight_version": self.version,
            "loss": 0.0,
            "entropy": 0.0,
            "gate": False,
            "w": c.w,
            "m": c.m,
            "target": c.target,
            "grad_norm": 0.0,
        }

    def prepare(self, trajectories):
        self.prepared.append((self.version, list(dict.fromkeys(t.group_id for t in trajectories))))

    def state_dict_for_rollout(self):
        return {}

    def save(self, directory, extra):
        return f"step_{self.step:06d}"


def _session(tmp_path, *, oversample: float, max_staleness: int = 0, steps: int = 2, extra=()):
    cfg = build_config(
        {},
        overrides=[
            *extra,
            f"run.output_dir={tmp_path}",
            f"run.steps={steps}",
            "run.checkpoint_every=1000",
            "rollout.prompts_per_step=4",
            "rollout.samples_per_prompt=2",
            "data.dynamic_sampling=true",
            f"data.oversample={oversample}",
            f"system.max_staleness={max_staleness}",
            "task.eval_every=1000",
        ],
    )
    t, learner = MemoryTransport(), FakeLearner(cfg)
    feeder = PromptFeeder(
        SimTask(4, (1.0, 1.0), 0), SimTokenizer(), run_id="r", group_size=2, seed=0, pool_size=64, log=lambda s: None
    )
    collector = GroupCollector(
        t.scored, name="learner", dynamic_sampling=True, max_staleness=max_staleness, decisions=MemoryDecisionLog()
    )
    rounds: list[int] = []  # prompts each pump found published

    def pump(_round: int) -> None:
        deliveries = t.prompts.consume("rollout", 1000)
        if not deliveries:
            return
        rounds.append(len(deliveries))
        records = []
        for d in reversed(deliveries):  # the last published finishes first
            n = int(d.record.group_id[1:])
            rewards = [1.0, 1.0] if n in FILTERED else [1.0, 0.0]
            records += [
                Trajectory(
                    run_id="r",
                    trajectory_id=f"{d.record.group_id}:{j}",
                    group_id=d.record.group_id,
                    group_size=2,
                    weight_version=learner.version,
                    prompt_token_ids=np.array([1], np.int32),
                    response_token_ids=np.array([1], np.int32),
                    response_logprobs=np.zeros(1, np.float32),
                    loss_mask=np.ones(1, np.uint8),
                    finish_reason="stop",
                    answer="",
                    problem_id="p",
                    data_source="sim",
                    response_text="",
                    reward=r,
                )
                for j, r in enumerate(rewards)
            ]
        t.scored.publish(records)
        t.prompts.ack([d.id for d in deliveries])

    seams = SessionSeams(
        transport=t,
        publisher=MemoryWeightBoard(),
        steering=RunSteering(MemoryRunState("r")),
        cursor=MemoryCursor(),
        evaluator=None,
        should_stop=lambda: False,
        wait=lambda s: None,
        pump=pump,
    )
    session = TrainingSession(
        cfg, learner, feeder, collector, seams, max_staleness=max_staleness, resume=False, say=lambda s: None
    )
    return session, learner, collector, t, rounds


def test_an_oversampled_round_trains_exactly_the_steps_groups_first_published_and_counts_the_surplus(tmp_path):
    session, learner, collector, t, rounds = _session(tmp_path, oversample=1.5)
    metrics = []
    session.run(on_step=metrics.append)
    session.close()
    # each step: one round of ceil(4 x 1.5) = 6 groups. Step 1: g0-g5, g2 and g5 filtered, 4 trainable:
    # all trained. Step 2: g6-g11, none filtered: the first four published (g6-g9) trained although
    # g11, g10 finished first; g10, g11 dropped as surplus
    assert rounds == [6, 6]
    assert learner.batches == [
        ["g000000000", "g000000001", "g000000003", "g000000004"],
        ["g000000006", "g000000007", "g000000008", "g000000009"],
    ]
    assert [m["surplus_groups"] for m in metrics] == [0, 2] and metrics[-1]["surplus_groups_total"] == 2
    assert collector.stats.surplus_groups == 2 and collector.ready == [] and not collector.closed
    # every published group is trained, filtered or dropped: none left in flight, no scored entry pending
    assert len(collector.finished) == session.feeder.cursor == 12
    assert t.scored.backlog() == 0


def test_without_oversampling_each_round_asks_for_exactly_the_missing_groups(tmp_path):
    session, learner, collector, _, rounds = _session(tmp_path, oversample=1.0)
    metrics = []
    session.run(on_step=metrics.append)
    session.close()
    # step 1: g0-g3, g2 filtered; round 2 asks for the 1 missing (g4); step 2: g5-g8, g5 filtered; then g9
    assert rounds == [4, 1, 4, 1]
    assert learner.batches == [
        ["g000000003", "g000000001", "g000000000", "g000000004"],  # completion order
        ["g000000008", "g000000007", "g000000006", "g000000009"],
    ]
    assert [m["surplus_groups"] for m in metrics] == [0, 0] and collector.stats.surplus_groups == 0


@pytest.mark.parametrize("early", [True, False])
def test_while_a_step_waits_the_session_prepares_the_ready_groups_it_will_take(tmp_path, early):
    # as above: after round 1 of each step three groups are ready and one is missing (filtered): the
    # session prepares those three (in the order the step takes them) at the step's version; the
    # round that completes the step prepares nothing (the batch is ready). Off: no call.
    session, learner, _, _, _ = _session(tmp_path, oversample=1.0, extra=[f"optim.prepass_early={early}"])
    metrics = []
    session.run(on_step=metrics.append)
    session.close()
    assert learner.prepared == (
        [(0, ["g000000003", "g000000001", "g000000000"]), (1, ["g000000008", "g000000007", "g000000006"])]
        if early
        else []
    )
    assert [m["prepared_groups"] for m in metrics] == ([3, 3] if early else [0, 0])


@pytest.mark.parametrize("oversample,window", [(1.0, 8), (1.5, 12), (1.3, 11)])
def test_off_policy_the_window_grows_by_the_factor(tmp_path, oversample, window):
    # ceil(4 x (1 + 1) x oversample) groups in flight before the first step
    session, _, _, t, _ = _session(tmp_path, oversample=oversample, max_staleness=1, steps=1)
    assert session.top_up_prompts() == window and t.prompts.backlog() == window
    session.close()


@pytest.mark.parametrize("value", [0.5, 10.5])
def test_oversample_is_bounded(value):
    from stare.config.base import ConfigError

    with pytest.raises((ConfigError, ValueError), match="oversample"):
        build_config({}, overrides=[f"data.oversample={value}"])


def test_a_later_round_is_sized_by_the_steps_yield_so_far(tmp_path, monkeypatch):
    # g0-g4 filtered: round 1 (6 groups) leaves 1 trainable, 3 missing; yield 1/6, so round 2 asks for
    # ceil(3 x 1.5 x 6) = 27 groups (g6-g32, all trainable): g5 + the first three published trained,
    # the other 24 surplus. (Without the yield: ceil(3 x 1.5) = 5 groups, and more rounds.)
    monkeypatch.setattr(sys.modules[__name__], "FILTERED", {0, 1, 2, 3, 4})
    session, learner, collector, _, rounds = _session(tmp_path, oversample=1.5, steps=1)
    metrics = []
    session.run(on_step=metrics.append)
    session.close()
    assert rounds == [6, 27] and metrics[0]["sampling_rounds"] == 2
    assert learner.batches == [["g000000005", "g000000006", "g000000007", "g000000008"]]
    assert metrics[0]["surplus_groups"] == 24 and metrics[0]["filtered_groups"] == 5
