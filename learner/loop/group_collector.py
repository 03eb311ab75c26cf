"""Assemble complete groups of scored trajectories for the learner.

* idempotent: a group is trained (or filtered, or dropped as stale) at most once; a trajectory id
  seen before in an open group, or any trajectory of a finished group, is a duplicate: counted and
  acknowledged, never trained. An entry handed back while still held (collected, or trained and
  not yet acknowledged) is ignored, not acknowledged, so a crash leaves it pending;
* complete groups only: a group is ready when all `group_size` trajectories have arrived;
* staleness, per token: a token's lag is `learner_version - the version that sampled it` (one version
  per trajectory, or several with in-flight weight updates: `Trajectory.version_starts`). A group
  whose every token is beyond `max_staleness` when it completes is dropped (counted), or, with
  `keep_stale`, trained anyway (the loss importance-corrects it against the rollout log-probs);
  `max_staleness = 0` is strictly on-policy. A ready group that waited until no token of it is within
  the bound (the learner stepped meanwhile) is dropped the same way before it can be taken, and
  `take(..., learner_version=)` removes the tokens beyond the bound from the loss of the groups it
  hands out (`loss_mask` 0; counted in `stats.stale_tokens`), so the bound holds for every trained
  token at the version it trains at. The per-trajectory lag of the first token is counted in
  `stats.staleness`;
* dynamic sampling: a group whose rewards are all equal carries no GRPO signal and is filtered
  (counted), when enabled;
* surplus (`data.oversample` on-policy): `take(n, in_publish_order=True)` hands out the first n
  ready groups in the feeder's order and `drop_ready()` finishes the rest untrained (counted in
  `stats.surplus_groups`), as the reference truncates its generation batch;
* acknowledgement: `take` hands groups out with their entry ids; the learner calls `trained(ids)`
  after the step and `ack_trained()` once a checkpoint holds those updates (the distributed
  learner) or at once (embedded). Until then a restarted learner finds them pending and trains
  them again from its checkpoint: nothing trained is lost with a crash, nothing is trained twice
  into the same weights.
* `state_dict` (in the checkpoint) holds the finished groups: ids of the form g<ordinal> are kept
  compactly as a watermark (every group below it is finished) plus the finished ones above it.
  A group filtered or dropped after the last checkpoint is acknowledged at once (its entries do not
  wait), so the decision is written to a `DecisionLog` first (Redis for the distributed learner):
  a restarted learner adds those groups to the finished set it restores, and the log is cleared
  once a checkpoint holds them. Without it such a group would count as in flight for ever.
* dead letters: a group whose prompt or one of whose trajectories was dead-lettered (poison,
  `system.max_deliveries`) can never complete; with a `DeadLetterFeed` over the training streams
  the collector closes such a group as filtered (finished, not trained; its entries acknowledged;
  counted in `stats.dead_lettered_groups`, the reason logged), so an on-policy step never waits
  for it. Only the feeder's groups (g<ordinal>) are closed; anything else dead-lettered is not ours.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from stare.transport.base import RecordStream
from stare.transport.dead_letters import DeadLetterFeed
from stare.transport.records import Trajectory
from stare.transport.redis_client import retrying, run_key

log = logging.getLogger(__name__)

_ORDINAL = re.compile(r"^g(\d+)$")  # group ids written by stare.data.feeder.PromptFeeder


@dataclass
class GroupStats:
    filtered_groups: int = 0
    stale_groups: int = 0
    stale_trajectories: int = 0
    duplicates: int = 0
    dead_lettered_groups: int = 0  # closed because their prompt or a trajectory was dead-lettered
    surplus_groups: int = 0  # trainable, over-sampled beyond a step's groups and dropped (data.oversample)
    stale_tokens: int = 0  # tokens of trained groups left out of the loss: beyond max_staleness (in-flight updates)
    # scored trajectories whose reward failed (reward 0 with reward_info.error): trained or filtered alike
    reward_errors: int = 0
    reissued_groups: int = 0  # published, then found nowhere (lost): published again (learner/loop/lost_groups.py)
    staleness: Counter = field(default_factory=Counter)  # lag -> trajectories collected with it
    _reward_errors_told: int = 0  # reward_errors at the previous `totals`

    def totals(self) -> dict[str, int]:
        """The run's counts so far, as each step's metrics carry them (called once a step: its
        `reward_errors` are those since the previous call)."""
        since, self._reward_errors_told = self.reward_errors - self._reward_errors_told, self.reward_errors
        return {
            "reward_errors": since,
            "filtered_groups_total": self.filtered_groups,
            "stale_groups_total": self.stale_groups,
            "stale_tokens_total": self.stale_tokens,
            "surplus_groups_total": self.surplus_groups,
            "duplicates_total": self.duplicates,
            "dead_lettered_groups_total": self.dead_lettered_groups,
            "reward_errors_total": self.reward_errors,
            "reissued_groups_total": self.reissued_groups,
        }


def round_size(missing: int, oversample: float, *, trainable: int = 0, filtered: int = 0) -> int:
    """Groups an on-policy sampling round publishes: the missing ones at oversample 1.0; else
    ceil(missing x oversample), a later round of the step (`trainable` and `filtered` of its earlier
    rounds) also divided by the step's yield so far, trainable / (trainable + filtered), at least 1/10,
    so that it rarely needs another round."""
    if oversample <= 1.0:
        return missing
    per_trainable = min(max(1.0, (trainable + filtered) / max(trainable, 1)), 10.0)
    return math.ceil(missing * oversample * per_trainable)


def _newest(trajectories: list[Trajectory]) -> int:
    """The version of a group's newest token: the group has a token within a staleness bound iff this is."""
    return max(t.newest_version for t in trajectories)


def _publish_key(group_id: str) -> tuple[int, int, str]:
    m = _ORDINAL.match(group_id)
    return (0, int(m.group(1)), "") if m else (1, 0, group_id)


class FinishedGroups:
    """The set of finished group ids, compact for feeder ids (a watermark + the ones above it)."""

    def __init__(self) -> None:
        self.watermark = 0  # every g<n> with n < watermark is finished
        self.above: set[int] = set()
        self.other: set[str] = set()  # ids that are not g<ordinal>

    def __contains__(self, group_id: str) -> bool:
        m = _ORDINAL.match(group_id)
        if m is None:
            return group_id in self.other
        n = int(m.group(1))
        return n < self.watermark or n in self.above

    def __len__(self) -> int:
        return self.watermark + len(self.above) + len(self.other)

    def add(self, group_id: str) -> None:
        m = _ORDINAL.match(group_id)
        if m is None:
            self.other.add(group_id)
            return
        self.above.add(int(m.group(1)))
        while self.watermark in self.above:
            self.above.remove(self.watermark)
            self.watermark += 1

    def state_dict(self) -> dict[str, Any]:
        return {"watermark": self.watermark, "above": sorted(self.above), "other": sorted(self.other)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.watermark, self.above, self.other = int(state["watermark"]), set(state["above"]), set(state["other"])


class DecisionLog(Protocol):
    """Durable record of the groups finished without training since the last checkpoint."""

    def record(self, group_id: str) -> None: ...

    def recorded(self) -> set[str]: ...

    def clear(self) -> None: ...


class MemoryDecisionLog:
    def __init__(self) -> None:
        self.groups: set[str] = set()

    def record(self, group_id: str) -> None:
        self.groups.add(group_id)

    def recorded(self) -> set[str]:
        return set(self.groups)

    def clear(self) -> None:
        self.groups.clear()


class RedisDecisionLog:
    """The groups the learner filtered or dropped since its last checkpoint, as a Redis set (see
    a restarted learner must know them, their entries are acknowledged)."""

    def __init__(self, client, run_id: str):
        self.client, self.key = client, run_key(run_id, "decided")

    def record(self, group_id: str) -> None:
        retrying(lambda: self.client.sadd(self.key, group_id), "SADD decided group")

    def recorded(self) -> set[str]:
        return {
            g.decode() if isinstance(g, bytes) else g
            for g in retrying(lambda: self.client.smembers(self.key), "SMEMBERS decided groups")
        }

    def clear(self) -> None:
        retrying(lambda: self.client.delete(self.key), "DEL decided groups")


class GroupCollector:
    def __init__(
        self,
        scored: RecordStream,
        *,
        name: str,
        dynamic_sampling: bool,
        max_staleness: int | None = None,
        keep_stale: bool = False,
        decisions: DecisionLog | None = None,
        dead_letters: DeadLetterFeed | None = None,
    ):
        self.scored, self.name = scored, name
        self.dynamic_sampling = dynamic_sampling
        self.max_staleness, self.keep_stale = max_staleness, keep_stale
        self.finished = FinishedGroups()
        self.partial: dict[str, dict[str, tuple[Trajectory, str]]] = {}  # group -> trajectory id -> (t, entry)
        self.ready: list[tuple[list[Trajectory], list[str]]] = []
        self.unacked: list[str] = []  # entries of trained groups, acknowledged at the next checkpoint
        self.closed: set[str] = set()  # groups complete and not yet finished (ready, or taken for a step)
        self.held: set[str] = set()  # entry ids collected and not yet acknowledged (partial, ready, taken, unacked)
        self.stats = GroupStats()
        self.dead_reasons: list[str] = []  # why each group closed by a dead letter since the last drain
        self.decisions = decisions
        self.dead_letters = dead_letters
        self._merge_decisions()

    def pull(self, learner_version: int, max_count: int = 4096, block_s: float = 0.0) -> int:
        """Read what the stream has (waiting up to block_s for it); returns entries read."""
        deliveries = self.scored.consume(self.name, max_count, block_s)
        duplicates: list[str] = []
        for d in deliveries:
            if d.id in self.held:  # the same entry handed back (a reconnect): still ours
                continue
            t: Trajectory = d.record
            group = self.partial.get(t.group_id)
            if (
                t.group_id in self.finished
                or t.group_id in self.closed
                or (group is not None and t.trajectory_id in group)
            ):
                duplicates.append(d.id)
                continue
            self.stats.staleness[learner_version - t.weight_version] += 1
            self.stats.reward_errors += "error" in (t.reward_info or {})
            group = self.partial.setdefault(t.group_id, {})
            group[t.trajectory_id] = (t, d.id)
            self.held.add(d.id)
            if len(group) == t.group_size:
                self._complete(self.partial.pop(t.group_id), learner_version)
        if duplicates:  # one acknowledgement for the batch of them
            self.stats.duplicates += len(duplicates)
            self.scored.ack(duplicates)
        self._close_dead_lettered()
        self._expire_ready(learner_version)
        return len(deliveries)

    def _expire_ready(self, learner_version: int) -> None:
        """Drop the ready groups whose lag grew past max_staleness while they waited (counted as stale)."""
        if self.max_staleness is None or self.keep_stale or not self.ready:
            return
        kept = []
        for trajectories, ids in self.ready:
            if learner_version - _newest(trajectories) > self.max_staleness:
                self.stats.stale_groups += 1
                self.stats.stale_trajectories += len(trajectories)
                self.closed.discard(trajectories[0].group_id)
                self._finish(trajectories[0].group_id, ids)
            else:
                kept.append((trajectories, ids))
        self.ready = kept

    def _close_dead_lettered(self) -> None:
        """Close the groups the dead-letter streams say can never complete (see the module docstring)."""
        if self.dead_letters is None:
            return
        for rec in self.dead_letters.new():
            group_id = rec.group_id
            if (
                group_id is None
                or _ORDINAL.match(group_id) is None
                or group_id in self.finished
                or group_id in self.closed
            ):
                continue  # not one of our groups, or decided already
            partial = self.partial.pop(group_id, {})
            self.stats.dead_lettered_groups += 1
            self.dead_reasons.append(rec.reason)  # the session drains it once per step (learner/loop/run_outcome.py)
            log.warning(
                "group %s closed without training: its %s entry %s was dead-lettered (%s); %d of its "
                "trajectories had arrived",
                group_id,
                rec.stream,
                rec.entry_id,
                rec.reason,
                len(partial),
            )
            self._finish(group_id, [e for _, e in partial.values()])

    def _complete(self, group: dict[str, tuple[Trajectory, str]], learner_version: int) -> None:
        trajectories = [t for t, _ in group.values()]
        ids = [e for _, e in group.values()]
        group_id = trajectories[0].group_id
        lag = learner_version - _newest(trajectories)  # of the group's newest token
        # lag < 0: sampled with weights newer than the learner's (published by a learner that died
        # before its checkpoint held them): never trainable, whatever the policy
        if lag < 0 or (self.max_staleness is not None and lag > self.max_staleness and not self.keep_stale):
            self.stats.stale_groups += 1
            self.stats.stale_trajectories += len(trajectories)
            self._finish(group_id, ids)
        elif self.dynamic_sampling and len({t.reward for t in trajectories}) == 1:
            self.stats.filtered_groups += 1
            self._finish(group_id, ids)
        else:
            self.closed.add(group_id)
            self.ready.append((trajectories, ids))

    def _finish(self, group_id: str, ids: list[str]) -> None:
        """A group decided without training (filtered, stale): final, acknowledged now."""
        if self.decisions is not None:
            self.decisions.record(group_id)  # before the ack: a crash in between only repeats the decision
        self.finished.add(group_id)
        self.scored.ack(ids)
        self.held.difference_update(ids)

    def forget_partial(self, group_id: str) -> int:
        """Drop what arrived of an incomplete group whose other trajectories are lost (it is sampled again,
        whole: a group never mixes two samplings): its entries are acknowledged. Returns how many."""
        ids = [e for _, e in self.partial.pop(group_id, {}).values()]
        if ids:
            self.scored.ack(ids)
            self.held.difference_update(ids)
        return len(ids)

    def upcoming(self, n_groups: int, in_publish_order: bool = False) -> list[list[Trajectory]]:
        """The ready groups `take(n_groups, in_publish_order)` would hand out now, left in place (the
        session prepares their pre-pass while it waits for the rest)."""
        ready = sorted(self.ready, key=lambda g: _publish_key(g[0][0].group_id)) if in_publish_order else self.ready
        return [trajectories for trajectories, _ in ready[:n_groups]]

    def take(
        self, n_groups: int, in_publish_order: bool = False, learner_version: int | None = None
    ) -> tuple[list[Trajectory], list[str]]:
        """Up to n ready groups, flattened, with the stream ids to pass to `trained` after the step.
        Default: in the order they completed; `in_publish_order`: the first n in the feeder's order
        (g<ordinal>; other ids after them), whatever finished first. `learner_version` (the version
        the step trains at): tokens more than max_staleness versions older leave the loss (drop policy)."""
        if in_publish_order:
            self.ready.sort(key=lambda g: _publish_key(g[0][0].group_id))
        taken, self.ready = self.ready[:n_groups], self.ready[n_groups:]
        trajectories = [t for g, _ in taken for t in g]
        if learner_version is not None and self.max_staleness is not None and not self.keep_stale:
            oldest = learner_version - self.max_staleness  # the oldest version a trained token may have
            for t in trajectories:
                if t.weight_version < oldest:  # only then can a token be too old
                    stale = (t.token_versions() < oldest) & (t.loss_mask > 0)  # [R]
                    self.stats.stale_tokens += int(stale.sum())
                    t.loss_mask = np.where(stale, 0, t.loss_mask).astype(np.uint8)
        return trajectories, [i for _, ids in taken for i in ids]

    def drop_ready(self) -> int:
        """Finish every ready group untrained (on-policy surplus: sampled with weights the next step
        will not have); returns how many, counted in `stats.surplus_groups`."""
        n, ready, self.ready = len(self.ready), self.ready, []
        for trajectories, ids in ready:
            self.closed.discard(trajectories[0].group_id)
            self._finish(trajectories[0].group_id, ids)
        self.stats.surplus_groups += n
        return n

    def trained(self, trajectories: list[Trajectory], ids: list[str]) -> None:
        """The step trained these: finished, acknowledged at the next `ack_trained`."""
        for group_id in {t.group_id for t in trajectories}:
            self.finished.add(group_id)
            self.closed.discard(group_id)
        self.unacked += ids

    def ack_trained(self) -> int:
        """Acknowledge everything trained so far (once a checkpoint holds it)."""
        n, ids = len(self.unacked), self.unacked
        self.scored.ack(ids)
        self.held.difference_update(ids)
        self.unacked = []
        if self.decisions is not None:
            self.decisions.clear()  # the checkpoint's finished set holds them now
        return n

    def state_dict(self) -> dict[str, Any]:
        return {"finished": self.finished.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.finished.load_state_dict(state["finished"])
        self._merge_decisions()

    def _merge_decisions(self) -> None:
        """Add the groups decided after the checkpoint (or before any) that the log still holds."""
        if self.decisions is not None:
            for group_id in self.decisions.recorded():
                self.finished.add(group_id)
