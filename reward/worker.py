"""The reward worker: raw trajectories in, scored trajectories out.

A record that breaks the wire invariants goes to the dead-letter stream with its reason; a
verifier that raises gives reward 0 with the error recorded in `reward_info`. Nothing is dropped.
Acknowledges raw entries only after the scored ones are published.
"""

from __future__ import annotations

from collections.abc import Callable

from reward.verifiers.compose import RewardInput, RewardResult, compute_reward
from stare.config.reward import RewardConfig
from stare.data.tasks.base import Problem, Task
from stare.transport.base import RecordStream
from stare.transport.guard import process_guarded
from stare.transport.records import RecordError, Trajectory


def reward_info(score: RewardResult, finish_reason: str) -> dict:
    """The reward_info of a scored trajectory (the same keys in every mode)."""
    # correct: the answer is right. With a composed reward that is its math component (a right answer
    # with an overlong penalty is still right), else a reward of at least 1.
    math = score.components.get("math")
    info: dict = {"correct": (math if math is not None else score.reward) >= 1.0, "finish_reason": finish_reason}
    if score.components:
        info["components"] = dict(score.components)
    if score.error is not None:
        info["error"] = score.error
    return info


def score_response(
    task: Task,
    config: RewardConfig | None,
    *,
    answer: str,
    problem_id: str,
    level: int,
    data_source: str,
    text: str,
    response_tokens: int,
) -> RewardResult:
    """THE scoring function of a response (the embedded reward worker and every `stare reward` pool
    process call it). `config` (the run config's `reward:` section) composes verifiers; None uses
    the task's own verifier. A verifier failure scores 0 with the error, never raises."""
    if config is not None:
        return compute_reward(RewardInput(response=text, response_tokens=response_tokens, answer=answer), config)
    problem = Problem(prompt="", answer=answer, problem_id=problem_id, level=max(level, 1), data_source=data_source)
    try:
        return RewardResult(reward=float(task.reward(problem, text)))
    except Exception as err:  # a verifier failure must not lose the trajectory
        return RewardResult(reward=0.0, error=f"{type(err).__name__}: {err}")


def score_trajectory(task: Task, t: Trajectory, config: RewardConfig | None = None) -> Trajectory:
    score = score_response(
        task,
        config,
        answer=t.answer,
        problem_id=t.problem_id,
        level=t.level,
        data_source=t.data_source,
        text=t.response_text,
        response_tokens=len(t.response_token_ids),
    )
    t.reward, t.reward_info = score.reward, reward_info(score, t.finish_reason)
    return t


class RewardWorker:
    """scorer: scores a batch in place (default: `score_trajectory` in this process, one by one;
    the `stare reward` role passes a process pool with a hard timeout per item)."""

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
        self.scorer = scorer or (lambda batch: [score_trajectory(self.task, t, reward_config) for t in batch])

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
