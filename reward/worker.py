"""The reward worker: raw trajectories in, scored trajectories out.

A record that breaks the wire invariants goes to the dead-letter stream with its reason; a
verifier that raises gives reward 0 with the error recorded in `reward_info`. Nothing is dropped.
Acknowledges raw entries only after the scored ones are published.
"""

from __future__ import annotations

from collections.abc import Callable

from reward.scorers import InProcessScorer, reward_info  # noqa: F401  (reward_info: its old home)
from stare.config.reward import RewardConfig
from stare.data.tasks.base import Task
from stare.transport.base import RecordStream
from stare.transport.guard import process_guarded
from stare.transport.records import RecordError, Trajectory


def score_trajectory(task: Task, t: Trajectory, config: RewardConfig | None = None) -> Trajectory:
    """One trajectory scored in this process (reward and reward_info set in place)."""
    InProcessScorer(task, config)([t])
    return t


class RewardWorker:
    """scorer: scores a batch in place (reward.scorers: default in this process, one by one; the `stare
    reward` role and a reward with a function of the user's own: the scoring processes, a hard time and
    memory limit per response)."""

    def __init__(
        self,
        task: Task,
        raw: RecordStream,
        scored: RecordStream,
        *,
        name: str,
        scorer: Callable[[list[Trajectory]], None] | None = None,
        reward_config: RewardConfig | None = None,
    ):
        self.task, self.raw, self.scored, self.name = task, raw, scored, name
        self.scorer = scorer or InProcessScorer(task, reward_config)

    def run_once(self, max_count: int = 1024, block_s: float = 0.0) -> int:
        return self.handle(self.raw.consume(self.name, max_count, block_s))

    def handle(self, deliveries: list) -> int:
        """`process` guarded: a trajectory that keeps failing ends in the dead-letter stream with its
        error instead of failing its batch or its worker (stare.transport.guard)."""
        return process_guarded(self.raw, deliveries, self.process)

    def process(self, deliveries: list) -> int:
        """Validate, score and publish `deliveries`; acknowledge them after the publish."""
        good, good_ids = [], []
        for d in deliveries:
            try:
                record = d.record.validate() if isinstance(d.record, Trajectory) else Trajectory.from_fields(d.record)
            except RecordError as err:
                self.raw.dead_letter(d.id, d.record, str(err))
                continue
            good.append(record)
            good_ids.append(d.id)
        if good:
            self.scorer(good)
            self.scored.publish(good)
            self.raw.ack(good_ids)
        return len(deliveries)
