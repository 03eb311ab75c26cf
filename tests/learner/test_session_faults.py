"""The training session after faults, with the real TrainingSession, a real redis-server for its streams
and a worker thread standing in for the rollout and reward workers (the learner itself a stand-in that
records what each step trained):

* a published group that exists nowhere any more (its prompt lost, as Redis under appendfsync everysec
  can lose the last second of writes when killed) is re-issued after two looks and trained once; a group
  a slow worker still holds is never re-issued;
* a weight version is recorded in the run's Redis before it is sent, so a learner dying mid-send leaves
  its successor a number to publish above."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from redis_fixtures import have_redis_server, redis_server
from test_oversample import FakeLearner

from learner.loop.group_collector import GroupCollector, MemoryDecisionLog
from learner.loop.session import MemoryCursor, SessionSeams, TrainingSession
from stare.app.sim.task import SimTask, SimTokenizer
from stare.config import build_config
from stare.data.feeder import PromptFeeder
from stare.runstate import MemoryRunState, RunSteering
from stare.transport.records import Trajectory
from stare.transport.redis_transport import RedisTransport
from stare.weight_sync.in_memory import MemoryWeightBoard

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not have_redis_server(), reason="needs redis-server on PATH")]

LOST, SLOW = "g000000001", "g000000002"  # the prompt Redis loses; the one a worker holds for 3 looks
LOOK_S = 0.6  # system.lost_group_check_s


def _trajectories(task, version: int) -> list[Trajectory]:
    return [
        Trajectory(
            run_id="r",
            trajectory_id=f"{task.group_id}:{j}",
            group_id=task.group_id,
            group_size=2,
            weight_version=version,
            prompt_token_ids=np.array([1], np.int32),
            response_token_ids=np.array([1], np.int32),
            response_logprobs=np.zeros(1, np.float32),
            loss_mask=np.ones(1, np.uint8),
            finish_reason="stop",
            answer="",
            problem_id="p",
            data_source="sim",
            reward=float(j),
        )
        for j in range(2)
    ]


class Workers(threading.Thread):
    """Rollout and reward in one: prompts in, scored trajectories out, acknowledged together. The first
    delivery of LOST vanishes from Redis as an unpersisted write would; SLOW is held 3 looks long."""

    def __init__(self, url: str, learner):
        super().__init__(daemon=True)
        self.t, self.learner, self.stop = RedisTransport.connect(url, "r"), learner, threading.Event()
        self.lost_once = False

    def run(self) -> None:
        held: list = []
        while not self.stop.is_set():
            for d in self.t.prompts.consume("w", 10, block_s=0.1):
                if d.record.group_id == LOST and not self.lost_once:
                    self.lost_once = True
                    self.t.prompts.ack([d.id])  # acknowledged and deleted: no record of the group is left
                elif d.record.group_id == SLOW:
                    held.append((time.monotonic() + 3 * LOOK_S, d))
                else:
                    self.t.scored.publish_and_ack(_trajectories(d.record, self.learner.version), self.t.prompts, [d.id])
            for due, d in [h for h in held if h[0] <= time.monotonic()]:
                held.remove((due, d))
                self.t.scored.publish_and_ack(_trajectories(d.record, self.learner.version), self.t.prompts, [d.id])


def _session(url: str, tmp_path, publisher=None, cursor=None):
    cfg = build_config(
        {},
        overrides=[
            f"run.output_dir={tmp_path}",
            "run.steps=3",
            "run.checkpoint_every=1000",
            "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=2",
            "data.dynamic_sampling=false",
            "system.max_staleness=0",
            f"system.lost_group_check_s={LOOK_S}",
            "task.eval_every=1000",
        ],
    )
    t, learner = RedisTransport.connect(url, "r"), FakeLearner(cfg)
    feeder = PromptFeeder(SimTask(4, (1.0, 1.0), 0), SimTokenizer(), run_id="r", group_size=2, seed=0, pool_size=64)
    collector = GroupCollector(
        t.scored, name="learner", dynamic_sampling=False, max_staleness=0, decisions=MemoryDecisionLog()
    )
    lines: list[str] = []
    deadline = time.monotonic() + 60
    seams = SessionSeams(
        transport=t,
        publisher=publisher or MemoryWeightBoard(),
        steering=RunSteering(MemoryRunState("r")),
        cursor=cursor or MemoryCursor(),
        evaluator=None,
        should_stop=lambda: time.monotonic() > deadline,  # a session that waits for ever fails here, not hangs
        wait=time.sleep,
    )
    session = TrainingSession(cfg, learner, feeder, collector, seams, max_staleness=0, resume=False, say=lines.append)
    return session, learner, collector, lines


def test_a_lost_group_is_reissued_and_trained_once_and_a_held_one_is_waited_for(tmp_path):
    with redis_server(tmp_path / "redis") as server:
        session, learner, collector, lines = _session(server.url, tmp_path)
        workers = Workers(server.url, learner)
        workers.start()
        try:
            outcome = session.run()
        finally:
            workers.stop.set()
            workers.join(timeout=10)
        assert outcome.outcome == "finished" and workers.lost_once
        trained = [g for batch in learner.batches for g in batch]
        assert sorted(trained) == [f"g{n:09d}" for n in range(6)]  # every group once, the lost one too
        assert collector.stats.reissued_groups == 1
        assert [line for line in lines if line.startswith("re-issued")] == [
            f"re-issued 1 published groups found in no stream at two looks in a row (['{LOST}']): lost with Redis "
            "(appendfsync everysec?) or deleted"
        ]
        assert any(line.startswith("waiting for data") for line in lines)


class RecordingPublisher(MemoryWeightBoard):
    """Notes the version the cursor store holds when each version is handed to it."""

    def __init__(self, cursor: MemoryCursor):
        super().__init__()
        self.cursor, self.seen = cursor, []

    def publish(self, version, state_dict) -> None:
        self.seen.append((version, self.cursor.load_version()))
        super().publish(version, state_dict)


def test_a_weight_version_is_recorded_before_it_is_sent(tmp_path):
    with redis_server(tmp_path / "redis") as server:
        cursor = MemoryCursor()
        publisher = RecordingPublisher(cursor)
        session, learner, _, _ = _session(server.url, tmp_path, publisher=publisher, cursor=cursor)
        workers = Workers(server.url, learner)
        workers.lost_once = True  # nothing lost here
        workers.start()
        try:
            session.run()
        finally:
            workers.stop.set()
            workers.join(timeout=10)
        assert publisher.seen == [(v, v) for v in range(4)]  # 818deb8: (v, v - 1), saved after the send
