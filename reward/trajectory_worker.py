"""The reward worker: raw trajectories in, scored trajectories out.

A record that breaks the wire invariants goes to the dead-letter stream with its reason; a
verifier that raises gives reward 0 with the error recorded in `reward_info`. Nothing is dropped.
Acknowledges raw entries only after the scored ones are published.
"""

from __future__ import annotations

from collections.abc import Callable

from stare.records import RecordError, Trajectory
from stare.tasks.base import Problem, Task
from stare.transport.base import RecordStream


def score_trajectory(task: Task, t: Trajectory) -> Trajectory:
    problem = Problem(prompt="", answer=t.answer, problem_id=t.problem_id, level=max(t.level, 1), data_source=t.data_source)
    try:
        t.reward = float(task.reward(problem, t.response_text))
        t.reward_info = {"correct": t.reward >= 1.0, "finish_reason": t.finish_reason}
    except Exception as err:  # a verifier failure must not lose the trajectory
        t.reward = 0.0
        t.reward_info = {"error": f"{type(err).__name__}: {err}"}
    return t


class RewardWorker:
    """scorer: scores a batch in place (default: `score_trajectory` in this process, one by one;
    the `stare reward` role passes a process pool with a hard timeout per item)."""

    def __init__(self, task: Task, raw: RecordStream, scored: RecordStream, *, name: str,
                 scorer: Callable[[list[Trajectory]], None] | None = None):
        self.task, self.raw, self.scored, self.name = task, raw, scored, name
        self.scorer = scorer or (lambda batch: [score_trajectory(self.task, t) for t in batch])

    def run_once(self, max_count: int = 1024, block_s: float = 0.0) -> int:
        return self.process(self.raw.consume(self.name, max_count, block_s))

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
