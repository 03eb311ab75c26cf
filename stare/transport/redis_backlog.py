"""How far the consumer group of a run's Redis stream is behind: its backlog, the entries it has not
acknowledged (pending) plus those never delivered to it. The bound a producer waits on
(`RedisStream.max_backlog`) and the queue depths the roles report come from here.

A run's stream has exactly one consumer group and holds exactly the entries that group has not
acknowledged: every acknowledgement deletes what it acknowledges, in the same MULTI (`queue_ack`:
XACK + XDEL). So the backlog is the stream's length, XLEN: exact, one O(1) read, and right after any
restart, since an AOF replays XDEL as it was written.

Never the group's `lag` / `entries-read` (XINFO GROUPS). Redis 7.0 writes an XREADGROUP to the AOF as
XCLAIM ... LASTID, which moves the group's last id but not its entries-read; after an AOF rewrite (which
Redis also starts by itself as the AOF grows) and a restart, the group's entries-read is the rewrite's,
so its lag counts every entry delivered since the rewrite as unread: a producer bounded on it stops for
good (fixed upstream by redis/redis pull request 12898, December 2023; Debian bookworm's 7.0.15 lacks it).
The lag is also unknown or wrong around deleted entries (redis/redis pull requests 13338, 13473).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis

from stare.transport.redis_dead_letters import as_str


def queue_ack(pipe: Any, key: str, group: str, ids: Sequence[str]) -> None:
    """Queue the acknowledgement of `ids` on `pipe`: XACK, then XDEL of the same entries (one group per
    stream: nobody else will read them), so that XLEN stays the backlog."""
    pipe.xack(key, group, *ids)
    pipe.xdel(key, *ids)


def ack(client: redis.Redis, key: str, group: str, ids: Sequence[str]) -> None:
    """Acknowledge and delete `ids` in one MULTI (both or neither)."""
    pipe = client.pipeline(transaction=True)
    queue_ack(pipe, key, group, ids)
    pipe.execute()


def backlog(client: redis.Redis, key: str) -> int:
    """The backlog of the stream's one group: its length (see the module docstring)."""
    return int(client.xlen(key))


def unacked_groups(client: redis.Redis, key: str, exclude: frozenset[str] | set[str], batch: int = 500) -> set[str]:
    """The group ids (`group_id`, or an evaluation task's `task_id`, in the entry's JSON header) of the
    stream's entries, which are its unacknowledged ones, but the entry ids in `exclude`."""
    out: set[str] = set()
    start = "-"
    while entries := client.xrange(key, min=start, count=batch):
        for entry_id, fields in entries:
            if entry_id is None or fields is None or as_str(entry_id) in exclude:
                continue
            try:
                header = json.loads(fields[b"json"])
                out.add(str(header.get("group_id", header.get("task_id"))))
            except (KeyError, ValueError, AttributeError):
                continue  # not a record (a consumer dead-letters it when it reads it)
        if len(entries) < batch:
            break
        last = entries[-1][0]
        if last is None:
            break
        start = "(" + as_str(last)
    return out


def next_id(entry_id: str) -> str:
    """The smallest stream id above `entry_id` ("ms-seq")."""
    ms, seq = entry_id.split("-")
    return f"{ms}-{int(seq) + 1}"


def open_group(client: redis.Redis, key: str, group: str) -> int:
    """Create `group` on stream `key` (and the stream) if missing; refuse a stream another group reads
    (acknowledging deletes entries: a second group would lose them); remove the entries the group
    acknowledged before entries were deleted on acknowledgement (a stream written by an older stare),
    which would otherwise count as backlog. Returns how many were removed.

    Safe beside live consumers: every entry below the group's oldest pending one and not after its last
    delivered one is acknowledged for good, and only those go (XTRIM MINID)."""
    try:
        client.xgroup_create(key, group, id="0", mkstream=True)
    except redis.ResponseError as err:
        if "BUSYGROUP" not in str(err):
            raise
    groups = client.xinfo_groups(key)
    others = sorted(as_str(g["name"]) for g in groups if as_str(g["name"]) != group)
    if others:
        raise ValueError(
            f"stream {key} is read by consumer groups {others} besides {group!r}: a run's stream has one group "
            "(its entries are deleted once acknowledged); use another run name, or delete those groups"
        )
    ours = next(g for g in groups if as_str(g["name"]) == group)
    bound = next_id(as_str(ours["last-delivered-id"]))
    if ours["pending"]:
        oldest = as_str(client.xpending(key, group)["min"])
        bound = min(bound, oldest, key=lambda i: tuple(int(p) for p in i.split("-")))
    return int(client.xtrim(key, minid=bound, approximate=False))
