"""`stare reward`: a reward worker process of the distributed system.

    raw stream (group "reward") -> validate -> score in a ScoringPool -> scored stream
    eval_raw (read first)       -> the same                           -> eval_scored

Scoring runs in a pool of worker processes with a hard timeout per trajectory (a verifier stuck
in C code or allocating without end is killed; the trajectory gets reward 0 and the reason).
Invalid records go to the raw stream's dead-letter stream with the reason. Raw entries are
acknowledged only after their scored records are published; entries a dead reward worker held
are reclaimed after `system.claim_idle_s`. Scale out by starting more of these.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from typing import Any

from reward.worker import reward_info
from stare.config import TrainConfig
from stare.config.reward import RewardConfig
from stare.transport.records import Trajectory

log = logging.getLogger(__name__)

SCORE_TIMEOUT_S = 30.0


@functools.lru_cache(maxsize=4)
def _task(name: str, kwargs_json: str):
    from stare.data.tasks.registry import build_verifier

    return build_verifier(name, **json.loads(kwargs_json))


@functools.lru_cache(maxsize=4)
def _reward_config(config_json: str):
    from stare.config.reward import RewardConfig

    return None if config_json == "null" else RewardConfig.model_validate_json(config_json)


def score_in_worker(
    task_name: str,
    kwargs_json: str,
    config_json: str,
    answer: str,
    problem_id: str,
    level: int,
    data_source: str,
    text: str,
    response_tokens: int,
):
    """Runs in a pool process: the shared `score_response` on one response (a RewardResult)."""
    from reward.worker import score_response

    return score_response(
        _task(task_name, kwargs_json),
        _reward_config(config_json),
        answer=answer,
        problem_id=problem_id,
        level=level,
        data_source=data_source,
        text=text,
        response_tokens=response_tokens,
    )


class PoolScorer:
    """Scores a batch concurrently in a ScoringPool (its own event loop, owned by this object)."""

    def __init__(
        self,
        task_name: str,
        task_kwargs: dict[str, Any],
        workers: int,
        timeout_s: float = SCORE_TIMEOUT_S,
        reward_config: RewardConfig | None = None,
    ):
        from reward.scoring_pool import ScoringPool, ScoringPoolConfig

        self.task_name, self.kwargs_json = task_name, json.dumps(task_kwargs, default=str)
        self.config_json = "null" if reward_config is None else reward_config.model_dump_json()
        self.loop = asyncio.new_event_loop()
        self.pool = ScoringPool(ScoringPoolConfig(workers=workers, timeout_s=timeout_s))
        self.loop.run_until_complete(self.pool.start())

    def __call__(self, batch: list[Trajectory]) -> None:
        async def one(t: Trajectory):
            return await self.pool.score(
                score_in_worker,
                self.task_name,
                self.kwargs_json,
                self.config_json,
                t.answer,
                t.problem_id,
                t.level,
                t.data_source,
                t.response_text,
                len(t.response_token_ids),
            )

        async def all_of():
            return await asyncio.gather(*(one(t) for t in batch))

        for t, result in zip(batch, self.loop.run_until_complete(all_of())):  # killed or failed: 0, with the reason
            t.reward, t.reward_info = float(result.reward), reward_info(result, t.finish_reason)

    def close(self) -> None:
        self.loop.run_until_complete(self.pool.close())
        self.loop.close()


def run(cfg: TrainConfig, *, redis_url: str, name: str, stop=None, workers: int = 1) -> None:
    from reward.worker import RewardWorker
    from stare.data.tasks.registry import build_verifier
    from stare.evaluation.streams import connect_eval_streams
    from stare.runtime.process import RoleRuntime, connect_transport
    from stare.transport.redis_streams import BackpressureError

    with RoleRuntime("reward", name, cfg, redis_url, stop=stop) as rt:
        # the verifier alone: the trajectory carries its ground truth, no dataset file is opened
        task_kwargs = cfg.task.verifier_kwargs()
        task = build_verifier(cfg.task.name, **task_kwargs)
        transport = connect_transport(cfg, redis_url)
        scorer = PoolScorer(cfg.task.name, task_kwargs, workers, reward_config=cfg.reward)
        worker = RewardWorker(task, transport.raw, transport.scored, name=name, scorer=scorer)
        evals = connect_eval_streams(cfg, transport.client, transport.trust)  # held-out samples, own streams
        eval_worker = RewardWorker(task, evals.raw, evals.scored, name=name, scorer=scorer)
        next_reclaim, done = 0.0, 0
        try:
            while not rt.stop.is_set():
                rt.tick(scored=done, pool_restarts=scorer.pool.restarts, redelivered=transport.raw.redelivered)
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
