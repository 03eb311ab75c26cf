"""One training session, built the same way for every mode: `stare train` (in-memory seams, workers
run in process), `stare learner` (Redis seams) and `stare sim` (simulated seams). What differs is
passed in: the seams, the feeder, the learner, where group decisions are kept."""

from __future__ import annotations

import logging
from collections.abc import Callable

from learner.loop.group_collector import DecisionLog, GroupCollector
from learner.loop.session import TrainingSession
from learner.loop.session_seams import SessionSeams
from stare.config import TrainConfig, staleness
from stare.transport.dead_letters import training_dead_letters

log = logging.getLogger(__name__)


def build_session(
    cfg: TrainConfig,
    learner,
    feeder,
    seams: SessionSeams,
    *,
    decisions: DecisionLog,
    consumer: str = "learner",
    rollout_in_process: bool = False,
    resume: bool,
    say: Callable[[str], None] = log.info,
) -> TrainingSession:
    """The run's `TrainingSession`: its group collector reads the scored stream of `seams` under the
    run's staleness policy (stare.config.staleness; `rollout_in_process`: the workers are run between
    steps with the newest weights, so strictly on-policy)."""
    policy = staleness(cfg, rollout_in_process=rollout_in_process)
    collector = GroupCollector(
        seams.transport.scored,
        name=consumer,
        dynamic_sampling=cfg.data.dynamic_sampling,
        max_staleness=policy.max_versions,
        keep_stale=policy.keep_stale,
        decisions=decisions,
        dead_letters=training_dead_letters(seams.transport),
    )
    return TrainingSession(
        cfg, learner, feeder, collector, seams, max_staleness=policy.max_versions, resume=resume, say=say
    )
