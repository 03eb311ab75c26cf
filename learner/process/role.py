"""`stare learner`: the learner process of the distributed system.

    feeder -> prompts stream ...rollout, reward... scored stream -> GroupCollector -> Learner
           -> weights (broadcast group or shared folder) -> rollout workers

The learner drives the pace. It keeps `prompts_per_step x (1 + max_staleness)` groups in flight
(published, not yet trained or filtered), each stamped `min_weight_version` = its version at
publish time, so a trajectory is at most `max_staleness` versions old when it is trained; groups
that arrive later than that are dropped whole (`stale_policy: drop`) or trained with the loss's
truncated importance correction (`importance`). `max_staleness: 0` is strictly on-policy; >= 1
lets rollout sample the next steps while the learner trains.

No data loss, no double training: scored entries a step trained stay pending in Redis until a
checkpoint holds that step (then they are acknowledged); the checkpoint keeps the finished
groups. A learner restarted after a crash loads its newest checkpoint, re-reads its pending
entries and trains again exactly the groups the checkpoint lacks; prompts are not published twice
(the published cursor lives in Redis). Entropy changes, pause, resume and checkpoint requests
come from the control plane through `RunSteering`. The loop is `learner.loop.session.TrainingSession`,
the same one `stare train` runs; this module wires its Redis seams.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from stare.config import TrainConfig

log = logging.getLogger(__name__)

LEARNER_CONSUMER = "learner"  # one learner per run: a stable consumer name, so a restart re-reads its entries


EvaluatorFactory = Callable[..., Any]  # (config, RunSetup, transport, tick, stop) -> an Evaluator
RolloutFactory = Callable[[], Any]  # () -> a RankRollout (learner/process/colocation.py), built by the application


def run(
    cfg: TrainConfig,
    *,
    redis_url: str,
    name: str = "learner",
    stop=None,
    evaluator_factory: EvaluatorFactory | None = None,
    rank_rollout: RolloutFactory | None = None,
) -> None:
    """The distributed learner: the shared `TrainingSession` over the run's Redis streams and
    weight publisher. `evaluator_factory` (given by the application that wires the roles) builds
    the held-out evaluator; None: no evaluation. Several ranks (`system.learner_ranks`, or an
    external launcher's WORLD_SIZE): this process is rank 0 and drives, or a follower
    (learner.process.ranks). `rank_rollout` (the node-colocated learner, learner/process/colocation.py): every
    rank hosts a rollout engine from it, asleep while the learner steps; rank 0 evaluates on its own."""
    from learner.process.rank_launch import rank_info

    ranks = rank_info(cfg)
    if not ranks.leader:
        run_follower(
            cfg, name, rollout=rank_rollout() if rank_rollout is not None else None, rank=ranks.rank, world=ranks.world
        )
        return
    _run_leader(
        cfg,
        redis_url=redis_url,
        name=name,
        stop=stop,
        evaluator_factory=evaluator_factory,
        spawn=ranks.spawn,
        world=ranks.world,
        rollout=rank_rollout() if rank_rollout is not None else None,
    )


def _build_learner(cfg: TrainConfig, model_path, pad_id: int, rollout, rank: int, world: int):
    """This rank's Learner; with a colocated `rollout`, its engine first, asleep (the process group formed
    before it when there are several ranks: vLLM joins it as one more data-parallel replica per rank)."""
    from learner.step.trainer import Learner

    if rollout is None:
        return Learner(cfg, model_path, pad_id=pad_id)
    from learner.process.colocation import TrainsAsleep

    if world > 1:
        from learner.engine.deepspeed_engine import init_distributed

        init_distributed()
    rollout.build(model_path, rank, world)
    learner = Learner(cfg, model_path, pad_id=pad_id)
    rollout.attach(learner)
    return TrainsAsleep(learner, rollout)


def run_follower(cfg: TrainConfig, name: str, *, rollout=None, rank: int = 1, world: int = 2) -> None:
    """A learner rank > 0: no Redis, no ports (colocated: its rollout worker's streams); it trains its share
    of each step as rank 0 says, and samples when rank 0 says so."""
    from learner.loop.session import seed_everything
    from learner.process.colocation import EVALUATE, SAMPLE
    from learner.process.rank_launch import (
        die_with_parent,
        exit_abandoning_process_groups,
        follower_model,
        leave_process_groups,
        rank_timeout_s,
    )
    from learner.process.ranks import RankChannel, follow

    die_with_parent()
    seed_everything(cfg)
    model_path, pad_id = follower_model(cfg)
    learner = _build_learner(cfg, model_path, pad_id, rollout, rank, world)
    channel = RankChannel(timeout_s=rank_timeout_s(cfg), heartbeat_s=min(10.0, rank_timeout_s(cfg) / 6))
    log.info("learner rank %d of %d following rank 0", channel.rank, channel.world)
    try:
        ops = {SAMPLE: rollout.sample, EVALUATE: rollout.evaluate_part} if rollout is not None else None
        steps = follow(learner, channel, ops)
    except Exception as err:  # rank 0 dead or hung, or this rank's part of an op failed: the group is unusable
        log.error("%s", err)
        exit_abandoning_process_groups(1)
    log.info("learner rank %d: rank 0 said stop after %d steps here", channel.rank, steps)
    if rollout is not None:
        log.info(
            "learner rank %d: %s; %d learner steps, the engine asleep at each",
            channel.rank,
            rollout.summary(),
            learner.steps_asleep,
        )
        rollout.close()
    leave_process_groups()


def _run_leader(
    cfg: TrainConfig,
    *,
    redis_url: str,
    name: str,
    stop,
    evaluator_factory: EvaluatorFactory | None,
    spawn: bool,
    world: int,
    rollout=None,
) -> None:
    from learner.loop.session import seed_everything
    from learner.process.rank_launch import FollowerProcesses, leave_process_groups, rank_timeout_s
    from learner.process.ranks import LeaderLearner, RankChannel
    from stare.models.resolve import load_run_setup
    from stare.plan.check import check_fits
    from stare.runtime.process import RoleRuntime
    from stare.runtime.run_lock import RunLock, write_failure

    # one writer per run folder: under `stare up` the launcher's lock (inherited), else this process's own
    lock = RunLock(cfg.run_dir, resume=True, say=log.warning)
    with lock, RoleRuntime("learner", name, cfg, redis_url, stop=stop) as rt:
        seed_everything(cfg)
        followers = None
        with rt.busy("loading the model"):
            setup = load_run_setup(cfg, log.info)
            check_fits(cfg, setup.model_path, log=log.info)  # refuse a config this GPU cannot hold (stare plan)
            pad_id = setup.tokenizer.pad_token_id or 0
            if spawn:
                followers = FollowerProcesses(cfg, model_path=setup.model_path, pad_id=pad_id, name=name)
            learner = _build_learner(cfg, setup.model_path, pad_id, rollout, 0, world)
            if world > 1:
                timeout_s = rank_timeout_s(cfg)
                learner = LeaderLearner(
                    learner,
                    RankChannel(timeout_s=timeout_s, heartbeat_s=min(10.0, timeout_s / 6)),
                    check=followers.check if followers is not None else (lambda: None),
                )
        try:
            _train(
                cfg,
                rt,
                setup,
                learner,
                redis_url=redis_url,
                evaluator_factory=evaluator_factory,
                rollout=rollout,
                world=world,
            )
        except OSError as err:  # a full or read-only disk: one line with the last complete checkpoint
            failure = write_failure(err, cfg.run_dir, again="start the learner again (it resumes from there)")
            if failure is None:
                raise
            raise failure from err
        finally:
            if world > 1 and isinstance(learner, LeaderLearner):
                try:
                    if followers is not None:
                        followers.check()  # a dead follower would make the stop op wait out its timeout
                    learner.close()  # the followers leave their loop
                except Exception as err:  # a follower already gone: it is killed below
                    log.error("could not tell the learner ranks to stop: %s", err)
            if followers is not None:
                followers.stop(timeout_s=rank_timeout_s(cfg))
            if rollout is not None:
                log.info(
                    "learner rank 0: %s; %d learner steps, the engine asleep at each",
                    rollout.summary(),
                    learner.steps_asleep,
                )
                rollout.close()
            if world > 1:
                leave_process_groups()


def _train(
    cfg: TrainConfig,
    rt,
    setup,
    learner,
    *,
    redis_url: str,
    evaluator_factory: EvaluatorFactory | None,
    rollout=None,
    world: int = 1,
) -> None:
    """Rank 0: the session over the run's Redis seams, then the Hugging Face export. With a colocated
    `rollout`: no weight publisher, the ranks sample through the pump and evaluate through the EVALUATE op."""
    from learner.engine.checkpoints import holds_checkpoint
    from learner.engine.export import export_run
    from learner.loop.build import build_session
    from learner.loop.group_collector import RedisDecisionLog
    from learner.loop.run_outcome import NothingTrained
    from learner.loop.session_seams import RedisCursor, SessionSeams
    from learner.process.colocation import DeferredPublish
    from stare.data.feeder import build_feeder
    from stare.runtime.process import connect_transport
    from stare.weight_sync.factory import build_publisher

    if rt.stop.is_set():  # SIGTERM while the model loaded: nothing trained, nothing to save
        log.info("stopped during start-up: nothing trained")
        return
    transport = connect_transport(cfg, redis_url, model_path=setup.model_path)
    feeder = build_feeder(cfg, setup.task, setup.tokenizer, log.info)
    evaluator = session = None
    colocated = colocated_seams(cfg, rt, learner, rollout, transport, world) if rollout is not None else {}
    publisher = colocated.pop("publisher", None) or build_publisher(cfg, transport.client)
    try:
        with rt.busy("loading the evaluator"):
            if rollout is not None:
                evaluator = rollout.evaluator(learner, world) if evaluator_factory is not None else None
            elif evaluator_factory is not None:
                evaluator = evaluator_factory(cfg, setup, transport, rt.tick, rt.stop.is_set)
        seams = SessionSeams(
            transport=transport,
            publisher=publisher,
            steering=rt.steering,
            cursor=RedisCursor(transport.client, cfg.run.name),
            evaluator=evaluator,
            should_stop=rt.stop.is_set,
            wait=rt.stop.wait,
            tick=rt.tick,
            busy=rt.busy,
            **colocated,
        )
        session = build_session(
            cfg,
            DeferredPublish(learner) if rollout is not None else learner,
            feeder,
            seams,
            decisions=RedisDecisionLog(transport.client, cfg.run.name),
            consumer=LEARNER_CONSUMER,
            resume=holds_checkpoint(cfg.run_dir / "checkpoints"),  # `latest` lost: the newest whole one
        )
        outcome = session.run()
        if outcome.failed:  # trained nothing, or no reward signal: not a success (learner/loop/run_outcome.py)
            raise NothingTrained(outcome.message)
        if outcome.outcome == "finished":  # run.steps trained, or data.epochs used up
            export_run(cfg.run_dir, setup.model_path, log.info, cfg.model.dtype)
    except BaseException:
        rt.steering.set_phase("failed", step=learner.step)
        raise
    finally:
        if session is not None:
            session.close()
        else:
            publisher.close()
        transport.close()
        if evaluator is not None and hasattr(evaluator, "close") and rollout is None:
            evaluator.close()


def colocated_seams(cfg: TrainConfig, rt, learner, rollout, transport, world: int) -> dict[str, Any]:
    """The seams of a node-colocated rank 0 (learner/process/colocation.py): the SAMPLE pump, no weight publisher
    (`stare sim` builds its simulated colocated node with this too)."""
    from learner.process.colocation import InProcessPublisher, SamplePump

    pump = SamplePump(
        learner,
        rollout,
        transport.prompts,
        world=world,
        collective=learner.weights_are_collective(),
        busy=rt.busy,
        retry_s=cfg.system.claim_idle_s / 2,
    )
    return {"publisher": InProcessPublisher(), "pump": pump, "pump_via_redis": True}
