"""The weight-sync backends a run config names (`system.weight_sync`), for each end of the seam."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stare.config import TrainConfig, staleness

if TYPE_CHECKING:  # torch stays out of the import of `stare up`
    import redis

    from stare.weight_sync.base import WeightPublisher, WeightSubscriber
    from stare.weight_sync.communicator import Setting

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def broadcast_bind_host(host: str) -> str:
    """Where the learner's rendezvous listens: the configured host if it is loopback, else every
    interface (workers dial `system.broadcast_host`, a name the learner's own host may not bind)."""
    return host if host in LOOPBACK else "0.0.0.0"


def communicator_setting(cfg: TrainConfig, *, rollout_end: bool) -> Setting:
    """`system.weight_sync_communicator`, checked against the rollout engine (pure). NCCL reaches a
    vLLM engine's GPU directly only with tensor_parallel_size 1 (its one worker runs in the rollout
    process); with more, vLLM's workers are other processes, so a rollout worker takes gloo under
    auto, and nccl is refused (at both ends, so the learner fails at start too)."""
    setting = cfg.system.weight_sync_communicator
    tp = getattr(cfg.rollout.engine, "tensor_parallel_size", 1)
    if tp > 1 and setting == "nccl":
        raise ValueError(
            f"system.weight_sync_communicator: nccl needs rollout.engine.tensor_parallel_size 1 (got {tp}): "
            "set the communicator to auto or gloo"
        )
    return "gloo" if tp > 1 and rollout_end else setting


def publish_from(cfg: TrainConfig, *, cuda: bool) -> str:
    """`system.weight_sync_publish_from` resolved (pure): "device" or "host". auto: device when the
    learner has CUDA and the broadcast may pick NCCL (`communicator_setting` not gloo)."""
    s = cfg.system
    if s.weight_sync_publish_from != "auto":
        return s.weight_sync_publish_from
    nccl = s.weight_sync == "broadcast" and communicator_setting(cfg, rollout_end=True) != "gloo"
    return "device" if cuda and nccl else "host"


def build_publisher(cfg: TrainConfig, client: redis.Redis, *, background: bool | None = None) -> WeightPublisher:
    """The learner's end. `client`: the run's Redis client (the filesystem backend keeps its
    version pointer there; the broadcast announces its address and epoch there, stare.weight_sync.rendezvous). `background` (None: when the run is off-policy, stare.config.staleness): publish from a
    thread of its own, the learner not waiting (stare.weight_sync.background)."""
    s = cfg.system
    if s.weight_sync == "broadcast":
        from stare.weight_sync.broadcast import BroadcastPublisher
        from stare.weight_sync.rendezvous import RedisRendezvous

        publisher: WeightPublisher = BroadcastPublisher(
            broadcast_bind_host(s.broadcast_host),
            s.broadcast_port,
            timeout_s=s.broadcast_timeout_s,
            communicator=communicator_setting(cfg, rollout_end=False),
            bucket_bytes=s.weight_sync_bucket_mb * 2**20,
            rendezvous=RedisRendezvous(client, cfg.run.name),
            announce_host=s.broadcast_host,
        )
    else:
        from stare.weight_sync.filesystem import FilesystemPublisher

        publisher = FilesystemPublisher(client, cfg.run.name, s.weight_dir or cfg.run_dir / "weights")
    if background if background is not None else staleness(cfg).off_policy:
        from stare.weight_sync.background import BackgroundPublisher

        return BackgroundPublisher(publisher, close_timeout_s=max(60.0, 4 * s.broadcast_timeout_s))
    return publisher


def receive_buffer_sets(cfg: TrainConfig) -> int:
    """Whole-model receive buffer sets of a broadcast subscriber: one when the worker takes every version
    between engine steps (in-flight weight updates: a set is released within a step), else two (a worker
    draining a long generation keeps the set it took while the next version arrives)."""
    return 1 if cfg.system.inflight_weight_updates else 2


def build_subscriber(cfg: TrainConfig, name: str, client: redis.Redis) -> WeightSubscriber:
    """A rollout worker's end, named `name` in the broadcast group; it dials the learner its run's Redis
    (`client`) announces, not the configured port (stare.weight_sync.rendezvous)."""
    s = cfg.system
    if s.weight_sync == "broadcast":
        from stare.weight_sync.broadcast import BroadcastSubscriber
        from stare.weight_sync.rendezvous import RedisRendezvous

        return BroadcastSubscriber(
            s.broadcast_host,
            s.broadcast_port,
            name,
            timeout_s=s.broadcast_timeout_s,
            communicator=communicator_setting(cfg, rollout_end=True),
            buffer_sets=receive_buffer_sets(cfg),
            locate=RedisRendezvous(client, cfg.run.name).current,
        )
    from stare.weight_sync.filesystem import FilesystemSubscriber

    return FilesystemSubscriber(client, cfg.run.name)
