"""How far a consumer group of a Redis stream is behind: the entries it has not acknowledged (pending)
plus those never delivered to it. The bound a producer waits on (`RedisStream.max_backlog`) and the
backlog the roles report come from here."""

from __future__ import annotations

import redis

from stare.transport.redis_dead_letters import as_str


def backlog_of(groups: list[dict], group: str) -> int | None:
    """pending + lag from an XINFO GROUPS reply; None when the group or its lag is unknown."""
    for g in groups:
        if as_str(g["name"]) == group and g["lag"] is not None:
            return g["pending"] + g["lag"]
    return None


def group_backlog(client, key: str, group: str, limit: int | None = None) -> int:
    """The group's backlog on stream `key` (counting at most `limit` never-delivered entries when the
    group's lag is unknown)."""
    groups = client.xinfo_groups(key)
    if (known := backlog_of(groups, group)) is not None:
        return known
    for g in groups:
        if as_str(g["name"]) == group:
            # lag is unknown after XDEL/SETID: count what follows the last delivered id (up to `limit`)
            n, start = 0, "(" + as_str(g["last-delivered-id"])
            while (limit is None or n < limit) and (batch := client.xrange(key, min=start, count=256)):
                n, start = n + len(batch), "(" + as_str(batch[-1][0])
            return g["pending"] + n
    raise redis.ResponseError(f"NOGROUP no consumer group {group} on {key}")
