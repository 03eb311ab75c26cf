"""The three streams of a run on one Redis (`RedisTransport`): prompts, raw and scored trajectories."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from stare.transport.record_tag import RecordTrust
from stare.transport.records import PromptTask, Trajectory
from stare.transport.redis_client import connect_client, stream_key
from stare.transport.redis_streams import RedisStream

_STREAMS = (("prompts", PromptTask, "rollout"), ("raw", Trajectory, "reward"), ("scored", Trajectory, "learner"))


@dataclass
class RedisTransport:
    """The three streams of a run on one Redis: prompts (PromptTask, group "rollout"), raw
    (Trajectory, group "reward"), scored (Trajectory, group "learner")."""

    client: redis.Redis
    prompts: RedisStream[PromptTask]
    raw: RedisStream[Trajectory]
    scored: RedisStream[Trajectory]
    trust: RecordTrust | None = None  # the record key and bounds its streams use (record_tag.py)

    @classmethod
    def connect(
        cls,
        url: str,
        run_id: str,
        *,
        socket_timeout_s: float = 5.0,
        trust: RecordTrust | None = None,
        **stream_options: Any,
    ) -> RedisTransport:
        """Connect to `url` (redis://host:port/db) with socket timeouts on every call and no hidden
        client-side retries (RedisStream retries, logged); `stream_options` go to each RedisStream. With
        `trust`, records are tagged when written and read only if their tag verifies and they keep its
        training bounds; without, plain records (tests, benches)."""
        client = connect_client(url, socket_timeout_s=socket_timeout_s)
        streams = {
            name: RedisStream(
                client,
                run_id,
                name,
                trust.codec(record, stream_key(run_id, name), trust.training) if trust is not None else record,
                group=group,
                **stream_options,
            )
            for name, record, group in _STREAMS
        }
        return cls(client=client, trust=trust, **streams)

    def close(self) -> None:
        self.client.close()
