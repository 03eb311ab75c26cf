"""Published groups are re-issued or finished, never waited for: the distributed learner's audit of the
groups it published that exist nowhere any more.

A published group lives in exactly one place at any moment, since every role acknowledges its input in
the same transaction that publishes its output: its prompt in the prompts stream (waiting, or held by a
rollout worker), its trajectories in the raw or scored stream, or in the learner's collector. A group can
still vanish: a Redis that loses its last second of writes when killed (`appendfsync everysec`, as
compose and Kubernetes run it) may lose the tail of a prompt publish the learner saw succeed; an operator
deletes a stream entry; a record is dead-lettered as untrusted (it closes no group). The learner then
waited for it for ever.

So when the learner has waited `system.lost_group_check_s` without a step, it looks (`LostGroups.look`):
every published group that is not finished, not complete in the collector and has no record in the
prompts, raw or scored stream (the collector's own entries aside) is a suspect; a group that is a suspect
at two looks in a row is lost, and is published again: the feeder rebuilds its task from its cursor (the
same prompt, group id and trajectory ids), what arrived of it is dropped (a group never mixes two
samplings), counted in `reissued_groups_total`, and said. The streams are read in the order records flow
(prompts, raw, scored), so a record moving on between two reads is still seen.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from stare.transport.base import queue_depths

log = logging.getLogger(__name__)

_ORDINAL = re.compile(r"^g(\d+)$")


class LostGroups:
    def __init__(self, feeder: Any, collector: Any, transport: Any, say: Callable[[str], None] = log.info):
        self.feeder, self.collector, self.transport, self.say = feeder, collector, transport, say
        self.suspects: set[str] = set()

    def unresolved(self) -> list[str]:
        """Published groups neither finished nor complete in the collector."""
        c = self.collector
        return [
            g
            for n in range(c.finished.watermark, self.feeder.cursor)
            if (g := f"g{n:09d}") not in c.finished and g not in c.closed
        ]

    def missing(self) -> set[str]:
        """The unresolved groups with no record in any stream (the collector's own entries aside)."""
        unresolved = self.unresolved()
        if not unresolved:
            return set()
        t = self.transport
        present: set[str] = t.prompts.unacked_groups() | t.raw.unacked_groups()
        present |= t.scored.unacked_groups(exclude=self.collector.held)
        return set(unresolved) - present

    def waiting(self, version: int, want: int) -> list[str]:
        """Say what the learner waits for, then look (`look`)."""
        depths = queue_depths(self.transport)
        self.say(
            f"waiting for data: {len(self.collector.ready)} of {want} groups ready, {len(self.unresolved())} "
            f"published groups not complete, queues {depths}"
        )
        return self.look(version)

    def look(self, version: int) -> list[str]:
        """One look (see the module docstring): re-issue what was missing at the last look too, stamped
        with `version`; returns the groups re-issued."""
        missing = self.missing()
        lost, self.suspects = sorted(missing & self.suspects), missing - self.suspects
        if not lost:
            return []
        tasks = []
        for group_id in lost:
            dropped = self.collector.forget_partial(group_id)
            task = self.feeder.task_at(int(_ORDINAL.match(group_id).group(1)))  # type: ignore[union-attr]
            task.min_weight_version = version
            tasks.append(task)
            if dropped:
                log.info(
                    "group %s: dropped the %d trajectories that had arrived; it is sampled again whole",
                    group_id,
                    dropped,
                )
        self.transport.prompts.publish(tasks)
        self.collector.stats.reissued_groups += len(tasks)
        self.say(
            f"re-issued {len(tasks)} published groups found in no stream at two looks in a row ({lost[:5]}"
            f"{' ...' if len(lost) > 5 else ''}): lost with Redis (appendfsync everysec?) or deleted"
        )
        return lost
