"""The held-out evaluation's own streams, beside the training ones, so that evaluation results
never reach the learner's group collector (they are never trained):

    eval_prompts (EvalTask, group "rollout") -> rollout workers -> eval_raw (Trajectory, group
    "reward") -> reward workers -> eval_scored (Trajectory, group "learner") -> the learner's
    StreamEvaluator

Rollout and reward workers read them before their training streams (evaluation first). The
`EvalIndex` (a Redis hash `stare:<run>:evals`) says which evaluations were published and which
are closed: a restarted learner collects an evaluation it had published instead of publishing it
again, and workers skip the tasks of a closed one (timed out, or finished before a redelivery).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from stare.transport.base import RecordStream, WireRecord
from stare.transport.in_memory import MemoryStream
from stare.transport.records import EvalTask, Trajectory

if TYPE_CHECKING:
    import redis

    from stare.config import TrainConfig
    from stare.transport.record_tag import RecordTrust

R = TypeVar("R", bound=WireRecord)

STREAMS = (
    ("tasks", "eval_prompts", EvalTask, "rollout"),
    ("raw", "eval_raw", Trajectory, "reward"),
    ("scored", "eval_scored", Trajectory, "learner"),
)


@dataclass
class EvalStreams:
    tasks: RecordStream[EvalTask]  # learner -> rollout workers (stream eval_prompts, group rollout)
    raw: RecordStream[Trajectory]  # rollout workers -> reward workers (eval_raw, group reward)
    scored: RecordStream[Trajectory]  # scored: reward workers -> learner (eval_scored, group learner)


def redis_eval_streams(
    client: redis.Redis, run_id: str, trust: RecordTrust | None = None, **stream_options: Any
) -> EvalStreams:
    """The run's evaluation streams on `client` (options: see RedisStream); with `trust`, tagged and bounded
    records (stare.transport.record_tag)."""
    from stare.transport.redis_client import stream_key
    from stare.transport.redis_streams import RedisStream

    def codec(name: str, record: Any) -> Any:
        return record if trust is None else trust.codec(record, stream_key(run_id, name), trust.evaluation)

    return EvalStreams(
        **{
            attr: RedisStream(client, run_id, name, codec(name, record), group=group, **stream_options)
            for attr, name, record, group in STREAMS
        }
    )


def memory_eval_streams() -> EvalStreams:
    return EvalStreams(
        tasks=MemoryStream("eval_prompts"), raw=MemoryStream("eval_raw"), scored=MemoryStream("eval_scored")
    )


class EvalIndex(Protocol):
    """Which evaluations were published (with their size) and which are closed."""

    def published(self, eval_id: str) -> dict[str, Any] | None: ...

    def publish(self, eval_id: str, info: dict[str, Any]) -> None: ...

    def close(self, eval_id: str, outcome: str) -> None: ...

    def is_open(self, eval_id: str) -> bool: ...

    def open_ids(self) -> list[str]: ...


@dataclass
class MemoryEvalIndex:
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)

    def published(self, eval_id: str) -> dict[str, Any] | None:
        return self.entries.get(eval_id)

    def publish(self, eval_id: str, info: dict[str, Any]) -> None:
        self.entries[eval_id] = {**info, "state": "open"}

    def close(self, eval_id: str, outcome: str) -> None:
        self.entries.setdefault(eval_id, {})["state"] = outcome

    def is_open(self, eval_id: str) -> bool:
        state: str = self.entries.get(eval_id, {}).get("state", "open")
        return state == "open"

    def open_ids(self) -> list[str]:
        return [e for e, info in self.entries.items() if info.get("state") == "open"]


class RedisEvalIndex:
    """The index as a Redis hash: eval id -> JSON {size, state}."""

    def __init__(self, client: redis.Redis, run_id: str):
        from stare.transport.redis_client import run_key

        self.client, self.key = client, run_key(run_id, "evals")

    def _get(self, eval_id: str) -> dict[str, Any] | None:
        from stare.transport.redis_client import retrying

        raw = retrying(lambda: self.client.hget(self.key, eval_id), "HGET evaluation")
        info: dict[str, Any] | None = None if raw is None else json.loads(raw)
        return info

    def _set(self, eval_id: str, info: dict[str, Any]) -> None:
        from stare.transport.redis_client import retrying

        retrying(lambda: self.client.hset(self.key, eval_id, json.dumps(info)), "HSET evaluation")

    def published(self, eval_id: str) -> dict[str, Any] | None:
        return self._get(eval_id)

    def publish(self, eval_id: str, info: dict[str, Any]) -> None:
        self._set(eval_id, {**info, "state": "open"})

    def close(self, eval_id: str, outcome: str) -> None:
        self._set(eval_id, {**(self._get(eval_id) or {}), "state": outcome})

    def is_open(self, eval_id: str) -> bool:
        info = self._get(eval_id)
        return info is None or info.get("state") == "open"

    def open_ids(self) -> list[str]:
        from stare.transport.redis_client import retrying

        entries = retrying(lambda: self.client.hgetall(self.key), "HGETALL evaluations")
        return sorted(
            k.decode() if isinstance(k, bytes) else k
            for k, v in entries.items()
            if json.loads(v).get("state") == "open"
        )


def connect_eval_streams(cfg: TrainConfig, client: redis.Redis, trust: RecordTrust | None = None) -> EvalStreams:
    """The run's evaluation streams on a role's Redis client (`trust`: the role's transport's), sized
    so that one whole evaluation fits: the learner publishes its tasks at once."""
    t, s = cfg.task, cfg.system
    samples = t.eval_problems * (1 + max([t.eval_k, *(e.n for e in t.eval_sources.values())]))
    backlog = max(s.max_backlog, samples)
    from stare.runtime.process import stream_options

    return redis_eval_streams(client, cfg.run.name, trust, **stream_options(cfg, backlog))
