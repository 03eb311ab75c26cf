"""The Redis RunState: the distributed system's run state, shared by the roles and the control plane.

Semantics are MemoryRunState's (base.py). Keys, all under `stare:{run_id}:`:

    heartbeats          hash  "role/name" -> Heartbeat JSON (a forgotten one is deleted by roles())
    name:{role}/{name}  str   who claimed a worker name (claim_name; expires after its ttl)
    status              str   the learner's status JSON
    metrics             list  one JSON object per step, trimmed to the last max_metrics
    metrics:total       int   entries ever appended (absolute index of the next one)
    controller          str   the learner's published controller state JSON
    entropy:pending     list  AuditEntry JSON of changes the learner has not taken yet
    entropy:audit       list  AuditEntry JSON of every change, trimmed to the last max_audit
    entropy:applied     hash  audit id -> {"step": N, "error": ...}
    entropy:seq         int   last audit id
    paused              str   "1" while paused
    checkpoint          str   "1" while a checkpoint request waits
    run:audit           list  CommandEntry JSON of every pause/resume/checkpoint, trimmed to the last max_audit
    run:seq             int   last run command id

Read-modify-write (validating a change against the published config and the pending ones) runs
under WATCH/MULTI, so several control-plane replicas cannot interleave. Every call has the
client's socket timeout and is retried with exponential backoff on ConnectionError/TimeoutError
(a Redis restart), at most `retries` times and `op_timeout_s` in all; then RunStateUnavailable.
The learner's writes are last-writer-wins; there is one learner per run.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import redis
from redis.client import Pipeline
from redis.typing import EncodableT

from stare.runstate.base import (
    DEFAULT_FORGET_AFTER_S,
    DEFAULT_MAX_AUDIT,
    DEFAULT_MAX_METRICS,
    AuditEntry,
    CommandEntry,
    Heartbeat,
    MetricsPage,
    RoleHealth,
    RunCommand,
    RunStateMalformed,
    RunStateUnavailable,
    forgotten,
    json_safe,
    merged_config,
    page_bounds,
    plan_change,
    published_max_entropy,
    rejected_entry,
    role_health,
)
from stare.runstate.redis_values import checked, count, entries, is_controller, parsed, tolerant
from stare.transport.redis_client import RETRYABLE_ERRORS, checked_key_part, connect_client, retrying
from stare.transport.redis_dead_letters import as_str

log = logging.getLogger(__name__)
T = TypeVar("T")
_HDEL_IF_SAME = (
    "if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end return 0"
)


class RedisRunState:
    def __init__(
        self,
        client: redis.Redis,
        run_id: str,
        *,
        dead_after_s: float = 15.0,
        max_metrics: int = DEFAULT_MAX_METRICS,
        max_audit: int = DEFAULT_MAX_AUDIT,
        forget_after_s: float = DEFAULT_FORGET_AFTER_S,
        op_timeout_s: float = 20.0,
        retries: int = 8,
        backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
    ):
        if client.connection_pool.connection_kwargs.get("socket_timeout") is None:
            raise ValueError("the Redis client needs a socket_timeout; build it with connect_client(url)")
        self.client, self.run_id, self.dead_after_s = client, checked_key_part(run_id, "run_id"), dead_after_s
        self.max_metrics, self.max_audit, self.forget_after_s = max_metrics, max_audit, forget_after_s
        self.op_timeout_s, self.retries, self.backoff_s, self.max_backoff_s = (
            op_timeout_s,
            retries,
            backoff_s,
            max_backoff_s,
        )

    @classmethod
    def connect(cls, url: str, run_id: str, *, socket_timeout_s: float = 5.0, **options: Any) -> RedisRunState:
        # a byte that is not UTF-8 (written by something else) reads as U+FFFD: the tolerant readers
        # below skip or keep the entry instead of failing the whole read
        client = connect_client(
            url, socket_timeout_s=socket_timeout_s, decode_responses=True, encoding_errors="replace"
        )
        return cls(client, run_id, **options)

    def close(self) -> None:
        self.client.close()

    def _key(self, name: str) -> str:
        return f"stare:{self.run_id}:{name}"

    def _call(self, op: Callable[[], T], what: str) -> T:
        try:
            return retrying(
                op,
                f"run state: {what}",
                op_timeout_s=self.op_timeout_s,
                retries=self.retries,
                backoff_s=self.backoff_s,
                max_backoff_s=self.max_backoff_s,
            )
        except RETRYABLE_ERRORS as err:
            if isinstance(err, redis.AuthenticationError):  # the user's mistake, not an outage
                raise
            raise RunStateUnavailable(f"run state (Redis) unavailable during {what}: {err}") from err
        except redis.ResponseError as err:
            if "WRONGTYPE" not in str(err):
                raise
            raise RunStateMalformed(
                f"run state: {what} found a key of another Redis type under stare:{self.run_id}: ({err}); "
                f"something other than stare wrote it: find it with redis-cli --scan --pattern 'stare:{self.run_id}:*' "
                "and TYPE, then DEL it"
            ) from None

    def _get_json(
        self, name: str, check: Callable[[Any], bool] = lambda v: isinstance(v, dict)
    ) -> dict[str, Any] | None:
        raw = self._call(lambda: self.client.get(self._key(name)), f"GET {name}")
        return None if raw is None else tolerant(raw, lambda r: checked(json.loads(r), check), self._key(name))

    # -- liveness and status ------------------------------------------------------------------

    def ping(self) -> bool:
        try:
            return bool(self.client.ping())
        except RETRYABLE_ERRORS:
            return False

    def beat(self, heartbeat: Heartbeat) -> None:
        field = f"{heartbeat.role}/{heartbeat.name}"
        self._call(lambda: self.client.hset(self._key("heartbeats"), field, heartbeat.model_dump_json()), "heartbeat")

    def roles(self) -> list[RoleHealth]:
        raw = self._call(lambda: self.client.hgetall(self._key("heartbeats")), "HGETALL heartbeats")
        now = time.time()
        beats = {
            k: tolerant(raw[k], Heartbeat.model_validate_json, f"{self._key('heartbeats')}[{as_str(k)}]")
            for k in sorted(raw)
        }
        health = {k: role_health(b, self.dead_after_s, now) for k, b in beats.items() if b is not None}
        for k in [k for k, h in health.items() if forgotten(h, self.forget_after_s)]:
            # only the beat read above: a worker that took the name again since keeps its fresh one
            self._call(
                functools.partial(self.client.eval, _HDEL_IF_SAME, 1, self._key("heartbeats"), k, raw[k]),
                "delete a forgotten heartbeat",
            )
            del health[k]
        return list(health.values())

    def claim_name(self, role: str, name: str, holder: str, ttl_s: float) -> bool:
        """Reserve the worker name `role/name` for `holder` (its host) for `ttl_s`: False if another
        holder reserved it within its ttl (two replicas starting at once take different names)."""
        key, ttl_ms = self._key(f"name:{role}/{name}"), max(int(ttl_s * 1000), 1)

        def op() -> bool:
            if self.client.set(key, holder, nx=True, px=ttl_ms):
                return True
            return self.client.get(key) == holder

        return self._call(op, "claim a worker name")

    def set_status(self, status: dict[str, Any]) -> None:
        self._call(lambda: self.client.set(self._key("status"), json.dumps(json_safe(status))), "SET status")

    def status(self) -> dict[str, Any] | None:
        return self._get_json("status")

    # -- metrics --------------------------------------------------------------------------------

    def append_metrics(self, metrics: dict[str, Any]) -> int:
        data = json.dumps(json_safe(metrics))

        def op() -> int:
            pipe = self.client.pipeline(transaction=True)
            pipe.rpush(self._key("metrics"), data)
            pipe.ltrim(self._key("metrics"), -self.max_metrics, -1)
            pipe.incr(self._key("metrics:total"))
            return int(pipe.execute()[2]) - 1

        return self._call(op, "append metrics")

    def metrics_page(self, offset: int = 0, limit: int = 100) -> MetricsPage:
        def counts() -> tuple[int, int]:
            pipe = self.client.pipeline(transaction=True)
            pipe.get(self._key("metrics:total"))
            pipe.llen(self._key("metrics"))
            total, length = pipe.execute()
            return count(total, self._key("metrics:total")), int(length)

        total, length = self._call(counts, "metrics counts")
        first = total - length
        start, stop = page_bounds(first, total, offset, limit)
        items: list[dict[str, Any]] = []
        if stop > start:
            # Positions from the end stay valid if another step is appended (and one trimmed) meanwhile.
            lo, hi = start - total, stop - total - 1
            raw = self._call(lambda: self.client.lrange(self._key("metrics"), lo, hi), "LRANGE metrics")
            # a malformed entry is skipped (and logged); `next` still moves past it
            parsed = [
                tolerant(r, lambda t: checked(json.loads(t), lambda v: isinstance(v, dict)), self._key("metrics"))
                for r in raw
            ]
            items = [m for m in parsed if m is not None]
            return MetricsPage(items=items, offset=start, next=start + len(raw), first=first, total=total)
        return MetricsPage(items=items, offset=start, next=start + len(items), first=first, total=total)

    # -- the entropy controller ---------------------------------------------------------------

    def publish_controller(self, state: dict[str, Any]) -> None:
        self._call(lambda: self.client.set(self._key("controller"), json.dumps(json_safe(state))), "SET controller")

    def controller(self) -> dict[str, Any] | None:
        return self._get_json("controller", is_controller)

    def request_entropy_change(self, changes: dict[str, Any], who: str) -> AuditEntry:
        keys = [self._key(k) for k in ("controller", "entropy:pending", "entropy:seq")]
        result: list[AuditEntry] = []

        def txn(pipe: Pipeline) -> None:
            published = pipe.get(keys[0])
            pending = entries(pipe.lrange(keys[1], 0, -1), keys[1])
            seq = count(pipe.get(keys[2]), keys[2])
            controller = (
                None
                if published is None
                else tolerant(published, lambda r: checked(json.loads(r), is_controller), keys[0])
            )
            current = merged_config(controller, pending)
            entry = plan_change(
                seq + 1,
                current,
                changes,
                who,
                time.time(),  # raises before MULTI: nothing written
                published_max_entropy(controller),
            )
            data = entry.model_dump_json()
            pipe.multi()
            pipe.set(keys[2], seq + 1)
            pipe.rpush(keys[1], data)
            pipe.rpush(self._key("entropy:audit"), data)
            pipe.ltrim(self._key("entropy:audit"), -self.max_audit, -1)
            result[:] = [entry]

        self._call(lambda: self.client.transaction(txn, *keys), "entropy change")
        return result[0]

    def pending_entropy_changes(self) -> list[AuditEntry]:
        raw = self._call(lambda: self.client.lrange(self._key("entropy:pending"), 0, -1), "LRANGE pending")
        return entries(raw, self._key("entropy:pending"))

    def take_entropy_changes(self) -> list[AuditEntry]:
        def op() -> list[str]:
            pipe = self.client.pipeline(transaction=True)
            pipe.lrange(self._key("entropy:pending"), 0, -1)
            pipe.delete(self._key("entropy:pending"))
            taken: list[str] = pipe.execute()[0]
            return taken

        return [parsed(r) for r in self._call(op, "take entropy changes")]

    def record_rejected(self, entry: AuditEntry, step: int, reason: str) -> None:
        result: list[int] = []

        def txn(pipe: Any) -> None:
            audit = [parsed(r) for r in pipe.lrange(self._key("entropy:audit"), 0, -1)]
            seq = count(pipe.get(self._key("entropy:seq")), self._key("entropy:seq"))
            copy = rejected_entry(entry, audit, seq + 1)
            pipe.multi()
            if copy is not None:
                pipe.set(self._key("entropy:seq"), seq + 1)
                pipe.rpush(self._key("entropy:audit"), copy.model_dump_json())
                pipe.ltrim(self._key("entropy:audit"), -self.max_audit, -1)
            result[:] = [entry.id if copy is None else copy.id]
            pipe.hset(self._key("entropy:applied"), str(result[0]), json.dumps({"step": step, "error": reason}))

        self._call(
            lambda: self.client.transaction(txn, self._key("entropy:audit"), self._key("entropy:seq")),
            "record rejected",
        )

    def record_applied(self, ids: list[int], step: int, error: str | None = None) -> None:
        if not ids:
            return
        mapping: Mapping[EncodableT, EncodableT] = {str(i): json.dumps({"step": step, "error": error}) for i in ids}
        self._call(lambda: self.client.hset(self._key("entropy:applied"), mapping=mapping), "record applied")

    def audit(self, limit: int = 100) -> list[AuditEntry]:
        if limit <= 0:
            return []
        raw = self._call(lambda: self.client.lrange(self._key("entropy:audit"), -limit, -1), "LRANGE audit")
        entries = [parsed(r) for r in raw]
        if not entries:
            return []
        ids = [str(e.id) for e in entries]
        applied = self._call(lambda: self.client.hmget(self._key("entropy:applied"), ids), "HMGET applied")
        out = []
        for e, a in zip(entries, applied):
            try:
                info: dict[str, Any] = json.loads(a) if a else {"step": None, "error": None}
                info = {
                    "step": int(info["step"]) if info.get("step") is not None else None,
                    "error": None if info.get("error") is None else str(info["error"]),
                }
            except (ValueError, TypeError, KeyError, AttributeError):
                info = {"step": None, "error": "malformed applied record in the store"}
            out.append(e.model_copy(update={"applied_step": info["step"], "error": info["error"]}))
        return out

    # -- run commands ---------------------------------------------------------------------------

    def set_paused(self, paused: bool) -> None:
        key = self._key("paused")
        self._call(lambda: self.client.set(key, "1") if paused else self.client.delete(key), "set paused")

    def paused(self) -> bool:
        return self._call(lambda: self.client.exists(self._key("paused")), "EXISTS paused") == 1

    def request_checkpoint(self) -> None:
        self._call(lambda: self.client.set(self._key("checkpoint"), "1"), "request checkpoint")

    def checkpoint_requested(self) -> bool:
        return self._call(lambda: self.client.exists(self._key("checkpoint")), "EXISTS checkpoint") == 1

    def take_checkpoint_request(self) -> bool:
        return self._call(lambda: self.client.getdel(self._key("checkpoint")), "GETDEL checkpoint") is not None

    def record_command(self, command: RunCommand, who: str) -> CommandEntry:
        def op() -> CommandEntry:
            entry = CommandEntry(
                id=int(self.client.incr(self._key("run:seq"))), who=who, when=time.time(), command=command
            )
            pipe = self.client.pipeline(transaction=True)
            pipe.rpush(self._key("run:audit"), entry.model_dump_json())
            pipe.ltrim(self._key("run:audit"), -self.max_audit, -1)
            pipe.execute()
            return entry

        return self._call(op, "record a run command")

    def commands(self, limit: int = 100) -> list[CommandEntry]:
        if limit <= 0:
            return []
        raw = self._call(lambda: self.client.lrange(self._key("run:audit"), -limit, -1), "LRANGE run:audit")
        parsed = (tolerant(r, CommandEntry.model_validate_json, self._key("run:audit")) for r in raw)
        return sorted((e for e in parsed if e is not None), key=lambda e: e.id)
