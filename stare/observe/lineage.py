"""A distributed run's data lineage, checked exactly: every step trained once, no trajectory trained
twice, no published group lost.

From the run folder: trained.jsonl (one line per step: the trajectory ids it trained, `<group>:<sample>`)
and metrics.jsonl. From the run's Redis (read once the run has stopped, e.g. its redis-server started
again from its AOF): the feeder's published cursor (`stare:<run>:feeder`, every group g<n> with
n < cursor was published) and the groups that still have an unacknowledged record in one of the run's
training streams (in flight when it stopped). A published group is lost when it was neither trained nor
is in flight; groups finished without training (filtered by dynamic sampling, dropped as stale,
dead-lettered) count as lost here, so check runs that train every group (dynamic sampling off, stale
groups importance-corrected), as the fault tests and the chaos run (scripts/chaos.py) do.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stare.transport.redis_client import run_key, stream_key

_GROUP = re.compile(r"^g(\d+)")
STREAMS = (("prompts", "rollout"), ("raw", "reward"), ("scored", "learner"))


@dataclass
class Lineage:
    steps: list[int]  # trained.jsonl's steps, in file order
    trained_ids: list[str]  # every trajectory id trained, in order (duplicates kept)
    metric_steps: list[int]  # metrics.jsonl's steps, in file order
    published: int  # groups g0 .. g<published - 1> were published
    in_flight: set[int] = field(default_factory=set)  # groups with a record still in a stream

    @property
    def trained_groups(self) -> set[int]:
        return {_ordinal(i) for i in self.trained_ids}

    @property
    def duplicates(self) -> list[str]:
        seen: set[str] = set()
        out = []
        for i in self.trained_ids:
            if i in seen:
                out.append(i)
            seen.add(i)
        return out

    @property
    def lost(self) -> list[int]:
        return sorted(set(range(self.published)) - self.trained_groups - self.in_flight)

    def problems(self, steps: int, rows_per_step: int) -> list[str]:
        """What breaks "every step once, 0 lost, 0 trained twice" for a run of `steps` steps of
        `rows_per_step` trajectories; empty when the lineage is exact."""
        out = []
        want = list(range(1, steps + 1))
        if self.steps != want:
            out.append(f"trained.jsonl has steps {_span(self.steps)}, expected 1..{steps} once each")
        if self.metric_steps != want:
            out.append(f"metrics.jsonl has steps {_span(self.metric_steps)}, expected 1..{steps} once each")
        if len(self.trained_ids) != steps * rows_per_step:
            out.append(f"{len(self.trained_ids)} trajectories trained, expected {steps} x {rows_per_step}")
        if dup := self.duplicates:
            out.append(f"{len(dup)} trajectories trained twice (first: {dup[:5]})")
        if lost := self.lost:
            out.append(f"{len(lost)} published groups neither trained nor in a stream (first: {lost[:10]})")
        if unpublished := sorted((self.trained_groups | self.in_flight) - set(range(self.published))):
            out.append(f"groups trained or in flight but never published: {unpublished[:10]}")
        return out

    def summary(self) -> str:
        return (
            f"published {self.published} groups, trained {len(self.trained_groups)} "
            f"({len(self.trained_ids)} trajectories, {len(self.duplicates)} twice), in flight at the end "
            f"{len(self.in_flight)}, lost {len(self.lost)}"
        )


def read_lineage(run_dir: Path, client: Any) -> Lineage:
    """The lineage of the run in `run_dir` (its name is the run id), `client`: a redis.Redis on its Redis."""
    run_id = run_dir.name
    trained = _jsonl(run_dir / "trained.jsonl")
    metrics = _jsonl(run_dir / "metrics.jsonl")
    cursor = client.hget(run_key(run_id, "feeder"), "cursor")
    return Lineage(
        steps=[int(t["step"]) for t in trained],
        trained_ids=[i for t in trained for i in t["ids"]],
        metric_steps=[int(m["step"]) for m in metrics],
        published=int(cursor or 0),
        in_flight=groups_in_streams(client, run_id),
    )


def groups_in_streams(client: Any, run_id: str) -> set[int]:
    """The groups (g<n> -> n) with a record some consumer group has not acknowledged (pending, or never
    delivered) in one of the run's training streams."""
    out: set[int] = set()
    for name, group in STREAMS:
        key = stream_key(run_id, name)
        if not client.exists(key):
            continue
        info = next(g for g in client.xinfo_groups(key) if _text(g["name"]) == group)
        pending = [p["message_id"] for p in client.xpending_range(key, group, min="-", max="+", count=1_000_000)]
        entries = [e for i in pending for e in client.xrange(key, i, i)]
        entries += client.xrange(key, min="(" + _text(info["last-delivered-id"]), max="+")
        for _, fields in entries:
            group_id = json.loads(fields[b"json"])["group_id"]
            if m := _GROUP.match(group_id):
                out.add(int(m.group(1)))
    return out


def _ordinal(trajectory_id: str) -> int:
    m = _GROUP.match(trajectory_id)
    if m is None:
        raise ValueError(f"trajectory id {trajectory_id!r} is not <g<n>:<sample>>")
    return int(m.group(1))


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _span(steps: list[int]) -> str:
    if len(steps) <= 8:
        return str(steps)
    return f"[{steps[0]} .. {steps[-1]}] ({len(steps)} lines, {len(set(steps))} distinct)"


def _text(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x
