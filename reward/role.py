"""`stare reward`: a reward worker process of the distributed system.

    raw stream (group "reward") -> validate -> score in a ScoringPool -> scored stream
    eval_raw (read first)       -> the same                           -> eval_scored

Scoring runs in a pool of worker processes with a hard timeout per trajectory (a verifier stuck
in C code or allocating without end is killed; the trajectory gets reward 0 and the reason), and
`reward.scoring`'s limits (reward.scorers: the same scorer `stare train` uses for a function of the
user's own; each failure is logged with its sample and counted in the health ticks' reward_errors).
Invalid records go to the raw stream's dead-letter stream with the reason. Raw entries are
acknowledged only after their scored records are published; entries a dead reward worker held
are reclaimed after `system.claim_idle_s`. Scale out by starting more of these.
"""

from __future__ import annotations

import logging
import time

from stare.config import TrainConfig

log = logging.getLogger(__name__)


def run(cfg: TrainConfig, *, redis_url: str, name: str, stop=None, workers: int | None = None) -> None:
    """`workers`: scoring processes (None: reward.scoring.workers, or 1 without a reward section)."""
    from reward.scorers import build_scorer
    from reward.verifiers.function import check_functions
    from reward.worker import RewardWorker
    from stare.data.tasks.registry import build_verifier
    from stare.evaluation.streams import connect_eval_streams
    from stare.runtime.process import RoleRuntime, connect_transport
    from stare.transport.redis_streams import BackpressureError

    check_functions(cfg.reward)  # a function of the user's own that cannot load: one line, exit 2
    with RoleRuntime("reward", name, cfg, redis_url, stop=stop) as rt:
        # the verifier alone: the trajectory carries its ground truth, no dataset file is opened
        task = build_verifier(cfg.task.name, **cfg.task.verifier_kwargs())
        transport = connect_transport(cfg, redis_url)
        scorer = build_scorer(cfg, task, pool=True, workers=workers, warn=log.warning)
        worker = RewardWorker(task, transport.raw, transport.scored, name=name, scorer=scorer)
        evals = connect_eval_streams(cfg, transport.client, transport.trust)  # held-out samples, own streams
        eval_worker = RewardWorker(task, evals.raw, evals.scored, name=name, scorer=scorer)
        next_reclaim, done = 0.0, 0
        try:
            while not rt.stop.is_set():
                rt.tick(
                    scored=done,
                    reward_errors=scorer.errors.total,
                    pool_restarts=scorer.pool.restarts,
                    redelivered=transport.raw.redelivered,
                )
                try:
                    if time.monotonic() >= next_reclaim:
                        next_reclaim = time.monotonic() + cfg.system.claim_idle_s / 2
                        if claimed := transport.raw.reclaim(name, max_count=256):
                            log.info("reclaimed %d trajectories left pending by a dead worker", len(claimed))
                            done += worker.handle(claimed)
                            continue
                        if claimed := evals.raw.reclaim(name, max_count=256):
                            done += eval_worker.handle(claimed)
                            continue
                    if scored := eval_worker.run_once(256):  # the learner waits for held-out scores: first
                        done += scored
                        continue
                    done += worker.run_once(256, block_s=1.0)
                except BackpressureError as err:  # the learner is behind: wait
                    log.warning("%s", err)
                    rt.stop.wait(1.0)
        finally:
            scorer.close()
            transport.close()
