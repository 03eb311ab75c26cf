"""The weight-sync backends a run config names (`system.weight_sync`), for each end of the seam."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stare.config import TrainConfig

if TYPE_CHECKING:  # torch stays out of the import of `stare up`
    from stare.weight_sync.base import WeightPublisher, WeightSubscriber

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def broadcast_bind_host(host: str) -> str:
    """Where the learner's rendezvous listens: the configured host if it is loopback, else every
    interface (workers dial `system.broadcast_host`, a name the learner's own host may not bind)."""
    return host if host in LOOPBACK else "0.0.0.0"


def build_publisher(cfg: TrainConfig, client, *, background: bool | None = None) -> WeightPublisher:
    """The learner's end. `client`: the run's Redis client (the filesystem backend keeps its
    version pointer there). `background` (None: when `system.max_staleness >= 1`): publish from a
    thread of its own, the learner not waiting (stare.weight_sync.background)."""
    s = cfg.system
    if s.weight_sync == "broadcast":
        from stare.weight_sync.broadcast import BroadcastPublisher

        publisher = BroadcastPublisher(broadcast_bind_host(s.broadcast_host), s.broadcast_port,
                                       timeout_s=s.broadcast_timeout_s, communicator=s.weight_sync_communicator,
                                       bucket_bytes=s.weight_sync_bucket_mb * 2**20)
    else:
        from stare.weight_sync.filesystem import FilesystemPublisher

        publisher = FilesystemPublisher(client, cfg.run.name, s.weight_dir or cfg.run_dir / "weights")
    if background if background is not None else s.max_staleness >= 1:
        from stare.weight_sync.background import BackgroundPublisher

        return BackgroundPublisher(publisher, close_timeout_s=max(60.0, 4 * s.broadcast_timeout_s))
    return publisher


def build_subscriber(cfg: TrainConfig, name: str, client) -> WeightSubscriber:
    """A rollout worker's end, named `name` in the broadcast group."""
    s = cfg.system
    if s.weight_sync == "broadcast":
        from stare.weight_sync.broadcast import BroadcastSubscriber

        return BroadcastSubscriber(s.broadcast_host, s.broadcast_port, name, timeout_s=s.broadcast_timeout_s,
                                   communicator=s.weight_sync_communicator)
    from stare.weight_sync.filesystem import FilesystemSubscriber

    return FilesystemSubscriber(client, cfg.run.name)
