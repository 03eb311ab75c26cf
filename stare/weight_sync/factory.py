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


def build_publisher(cfg: TrainConfig, client) -> WeightPublisher:
    """The learner's end. `client`: the run's Redis client (the filesystem backend keeps its
    version pointer there)."""
    s = cfg.system
    if s.weight_sync == "broadcast":
        from stare.weight_sync.broadcast import BroadcastPublisher

        return BroadcastPublisher(broadcast_bind_host(s.broadcast_host), s.broadcast_port,
                                  timeout_s=s.broadcast_timeout_s)
    from stare.weight_sync.filesystem import FilesystemPublisher

    return FilesystemPublisher(client, cfg.run.name, s.weight_dir or cfg.run_dir / "weights")


def build_subscriber(cfg: TrainConfig, name: str, client) -> WeightSubscriber:
    """A rollout worker's end, named `name` in the broadcast group."""
    s = cfg.system
    if s.weight_sync == "broadcast":
        from stare.weight_sync.broadcast import BroadcastSubscriber

        return BroadcastSubscriber(s.broadcast_host, s.broadcast_port, name, timeout_s=s.broadcast_timeout_s)
    from stare.weight_sync.filesystem import FilesystemSubscriber

    return FilesystemSubscriber(client, cfg.run.name)
