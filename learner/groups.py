"""Assemble complete groups of scored trajectories for the learner.

* idempotent: a trajectory id seen before (a redelivery) is acknowledged and never trained twice;
  an entry handed back while still held (not yet trained) is ignored, not acknowledged, so a
  learner crash before training leaves it pending;
* complete groups only: a group is ready when all `group_size` trajectories have arrived;
* staleness: a trajectory more than `max_staleness` versions behind the learner is dropped (and
  counted), so `max_staleness = 0` is strictly on-policy;
* dynamic sampling: a group whose rewards are all equal carries no GRPO signal and is filtered
  (counted), when enabled.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from stare.records import Trajectory
from stare.transport.base import RecordStream


@dataclass
class GroupStats:
    filtered_groups: int = 0
    stale_trajectories: int = 0
    duplicates: int = 0
    staleness: Counter = field(default_factory=Counter)


class GroupCollector:
    def __init__(self, scored: RecordStream, *, name: str, dynamic_sampling: bool, max_staleness: int | None = None):
        self.scored, self.name = scored, name
        self.dynamic_sampling = dynamic_sampling
        self.max_staleness = max_staleness
        self.seen: set[str] = set()
        self.partial: dict[str, list[Trajectory]] = defaultdict(list)
        self.partial_ids: dict[str, list[str]] = defaultdict(list)
        self.ready: list[tuple[list[Trajectory], list[str]]] = []
        self.stats = GroupStats()

    def pull(self, learner_version: int, max_count: int = 4096) -> None:
        held = {i for ids in self.partial_ids.values() for i in ids} | {i for _, ids in self.ready for i in ids}
        for d in self.scored.consume(self.name, max_count):
            t: Trajectory = d.record
            if d.id in held:  # the same entry handed back (a reconnect): still ours, not yet trained
                continue
            if t.trajectory_id in self.seen:  # another entry with a trajectory already collected
                self.stats.duplicates += 1
                self.scored.ack([d.id])
                continue
            self.seen.add(t.trajectory_id)
            lag = learner_version - t.weight_version
            self.stats.staleness[lag] += 1
            if self.max_staleness is not None and lag > self.max_staleness:
                self.stats.stale_trajectories += 1
                self.scored.ack([d.id])
                continue
            self.partial[t.group_id].append(t)
            self.partial_ids[t.group_id].append(d.id)
            if len(self.partial[t.group_id]) == t.group_size:
                group, ids = self.partial.pop(t.group_id), self.partial_ids.pop(t.group_id)
                if self.dynamic_sampling and len({g.reward for g in group}) == 1:
                    self.stats.filtered_groups += 1
                    self.scored.ack(ids)
                    continue
                self.ready.append((group, ids))

    def take(self, n_groups: int) -> tuple[list[Trajectory], list[str]]:
        """Up to n ready groups, flattened, with the stream ids to ack once trained."""
        taken, self.ready = self.ready[:n_groups], self.ready[n_groups:]
        return [t for g, _ in taken for t in g], [i for _, ids in taken for i in ids]
