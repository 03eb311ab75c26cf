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


def reward_info(reward: float, finish_reason: str, error: str | None = None) -> dict:
    """The reward_info of a scored trajectory (the same keys in every mode)."""
    info = {"correct": reward >= 1.0, "finish_reason": finish_reason}
    if error is not None:
        info["error"] = error
    return info


def score_response(task: Task, *, answer: str, problem_id: str, level: int, data_source: str,
                   text: str) -> tuple[float, str | None]:
    """THE scoring function of a response (the embedded reward worker and every `stare reward` pool
    process call it): its reward, and the error when the verifier failed (then the reward is 0)."""
    problem = Problem(prompt="", answer=answer, problem_id=problem_id, level=max(level, 1), data_source=data_source)
    try:
        return float(task.reward(problem, text)), None
    except Exception as err:  # a verifier failure must not lose the trajectory
        return 0.0, f"{type(err).__name__}: {err}"


def score_trajectory(task: Task, t: Trajectory) -> Trajectory:
    reward, error = score_response(task, answer=t.answer, problem_id=t.problem_id, level=t.level,
                                   data_source=t.data_source, text=t.response_text)
    t.reward, t.reward_info = reward, reward_info(reward, t.finish_reason, error)
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
