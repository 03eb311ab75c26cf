"""The run's staleness policy, read from the config in this one place (the learner's group collector
and session, the weight publisher, the stream backlog and `stare plan` all ask it)."""

from __future__ import annotations

from dataclasses import dataclass

from stare.config.train import TrainConfig


@dataclass(frozen=True)
class Staleness:
    """The run's staleness policy: how many weight versions a trained token may lag, and what happens
    to older ones. Read from `system.max_staleness` and `system.stale_policy` here only."""

    max_versions: int  # 0: strictly on-policy
    keep_stale: bool  # stale_policy importance: older tokens train with truncated IS instead of being dropped

    @property
    def off_policy(self) -> bool:
        """The learner does not wait for its weights to reach the workers (a background publish, two copies)."""
        return self.max_versions >= 1


def staleness(cfg: TrainConfig, *, rollout_in_process: bool = False) -> Staleness:
    """The staleness policy of a run. `rollout_in_process` (`stare train`: the workers are run between
    steps with the newest weights) is strictly on-policy whatever the config says."""
    if rollout_in_process:
        return Staleness(0, keep_stale=False)
    return Staleness(cfg.system.max_staleness, keep_stale=cfg.system.stale_policy == "importance")
