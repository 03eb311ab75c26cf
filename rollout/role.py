"""`stare rollout`: a rollout worker process of the distributed system.

    prompts (Redis stream, group "rollout") -> RolloutWorker (vLLM or transformers) -> raw stream
    eval_prompts (read first)                -> EvalSampler (same engine)            -> eval_raw

It takes the learner's weights from the configured backend (broadcast group or shared folder)
between batches, samples each prompt batch with weights at least as new as the batch asks
(`PromptTask.min_weight_version`: the staleness bound), publishes the trajectories, and only then
acknowledges the prompts. Prompts left pending by a dead worker are reclaimed after
`system.claim_idle_s`. Stops after the current batch on SIGTERM.

With `system.rollout_streaming` (the default for vLLM) the engine is fed continuously instead
(rollout/streaming.py): training prompts and evaluation tasks share it, each group is published
as soon as its last sample ends, and weights change only when nothing of the old version is in
flight (or between any two engine steps: `system.inflight_weight_updates`). On SIGTERM it stops after the current engine step; prompts still in the engine stay
pending for the successor.
"""

from __future__ import annotations

import logging
import time

from stare.config import TrainConfig

log = logging.getLogger(__name__)


def run(cfg: TrainConfig, *, redis_url: str, name: str, stop=None) -> None:
    from rollout.evaluation import EvalSampler
    from rollout.stack import build_rollout_stack
    from rollout.streaming import streaming_loop
    from rollout.worker import RolloutWorker
    from stare.evaluation.streams import RedisEvalIndex, connect_eval_streams
    from stare.runtime.process import RoleRuntime, connect_transport
    from stare.runtime.threads import apply_threads
    from stare.transport.redis_streams import BackpressureError
    from stare.weight_sync.factory import build_subscriber

    apply_threads(cfg)  # run.threads, at most the CPUs this process may use
    with RoleRuntime("rollout", name, cfg, redis_url, stop=stop) as rt:
        stack = build_rollout_stack(cfg, log.info)
        engine, tokenizer = stack.engine, stack.setup.tokenizer
        transport = connect_transport(cfg, redis_url, getattr(engine, "vocab_size", None), stack.setup.model_path)
        weights = build_subscriber(cfg, name, transport.client)
        r = cfg.rollout
        worker = RolloutWorker(
            engine,
            tokenizer,
            transport.prompts,
            transport.raw,
            weights,
            name=name,
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            stop_token_ids=stack.setup.stop_ids,
            agent=stack.agent,
            should_stop=rt.stop.is_set,
            seed=cfg.run.seed,
            max_prompt_len=cfg.data.max_prompt_len,
            prompt_overflow=cfg.data.prompt_overflow,
            tick=rt.tick,
            keep_rows=cfg.reward is not None and cfg.reward.needs_rows,
        )
        evals = connect_eval_streams(cfg, transport.client, transport.trust)
        eval_sampler = EvalSampler(
            worker, evals.tasks, evals.raw, is_open=RedisEvalIndex(transport.client, cfg.run.name).is_open
        )
        batch = cfg.system.rollout_batch_prompts
        stream = streaming_loop(cfg, worker, engine, eval_sampler)
        log.info(
            "rollout: %s",
            f"streaming, engine capacity {engine.capacity()} sequences"
            f"{', weights taken in flight' if cfg.system.inflight_weight_updates else ''}"
            if stream
            else f"batches of {batch} prompts",
        )
        next_reclaim, done = 0.0, 0
        try:
            while not rt.stop.is_set():
                rt.tick(
                    prompts=done,
                    eval_tasks=eval_sampler.sampled,
                    weight_version=engine.weight_version,
                    redelivered=transport.prompts.redelivered,
                    **({"in_flight": stream.in_flight()} if stream is not None else {}),
                )
                try:
                    if time.monotonic() >= next_reclaim:  # prompts a dead worker held
                        next_reclaim = time.monotonic() + cfg.system.claim_idle_s / 2
                        if claimed := transport.prompts.reclaim(name, max_count=batch):
                            log.info("reclaimed %d prompts left pending by a dead worker", len(claimed))
                            if stream is not None:
                                stream.offer("train", claimed)
                            else:
                                with rt.busy("sampling"):
                                    done += worker.handle(claimed)
                                continue
                        if claimed := evals.tasks.reclaim(name, max_count=batch):
                            if stream is not None:
                                stream.offer("eval", claimed)
                            else:
                                with rt.busy("evaluating"):
                                    eval_sampler.handle(claimed)
                                continue
                    if stream is not None:  # evaluation tasks first, inside the loop
                        with rt.busy("sampling"):
                            done += stream.run_once(block_s=1.0)
                        continue
                    with rt.busy("evaluating"):  # held-out tasks first: the learner waits for them
                        if eval_sampler.run_once(batch):
                            continue
                    with rt.busy("sampling"):  # a long generation is alive while it computes
                        done += worker.run_once(batch, block_s=1.0)
                except BackpressureError as err:  # reward workers are behind: wait, keep the prompts
                    log.warning("%s", err)
                    rt.stop.wait(1.0)
        finally:
            weights.close()
            stack.close()
            transport.close()
