"""Poison inputs: over-long prompts are truncated left or dead-lettered with the reason; an entry
that keeps failing (or killing its consumer) is dead-lettered with its last error after
max_deliveries deliveries, on the in-memory stream and on a real redis-server alike."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis_fixtures import have_redis_server, redis_server

from rollout.prompt_guard import fit_prompt, prompt_limit
from stare.transport.guard import process_guarded
from stare.transport.in_memory import MemoryStream
from stare.transport.records import PromptTask
from stare.transport.redis_transport import RedisTransport

MAX = 3


def _prompt(i: int, n_tokens: int = 3) -> PromptTask:
    return PromptTask(
        run_id="p",
        group_id=f"g{i}",
        prompt="x",
        prompt_token_ids=list(range(1, n_tokens + 1)),
        answer="1",
        problem_id=f"p{i}",
        data_source="t",
        group_size=2,
    )


def test_the_prompt_limit_is_the_smaller_of_the_config_and_what_the_engine_leaves():
    assert prompt_limit(None, 100, 30) == 70
    assert prompt_limit(50, 100, 30) == 50
    assert prompt_limit(80, 100, 30) == 70
    assert prompt_limit(None, None, 30) is None


def test_an_over_long_prompt_keeps_its_last_tokens_or_is_rejected_with_the_reason():
    assert fit_prompt([1, 2, 3, 4, 5], 3, "truncate_left") == ([3, 4, 5], None)
    assert fit_prompt([1, 2, 3], 3, "reject") == ([1, 2, 3], None)
    ids, reason = fit_prompt([1, 2, 3, 4, 5], 3, "reject")
    assert ids is None and "5 tokens, over the limit of 3" in reason and "prompt_overflow=reject" in reason
    assert fit_prompt([], 3, "truncate_left")[1].startswith("empty prompt")
    assert "outside the model's vocabulary [0, 10)" in fit_prompt([1, 10], 3, "truncate_left", vocab_size=10)[1]


def _failing_on(bad: set[str], calls: list[str]):
    def handle(deliveries) -> int:
        calls.extend(d.record.group_id for d in deliveries)
        if any(d.record.group_id in bad for d in deliveries):
            raise RuntimeError("verifier exploded")
        return len(deliveries)

    return handle


def _drain(stream, consume, handle, acker, rounds: int = 20) -> int:
    done = 0
    for _ in range(rounds):
        done += process_guarded(stream, consume(), lambda ds: acker(ds, handle))
    return done


def _ack_after(stream):
    def acker(deliveries, handle):
        n = handle(deliveries)
        stream.ack([d.id for d in deliveries])
        return n

    return acker


def test_memory_stream_a_failing_entry_is_dead_lettered_with_its_last_error_and_spares_its_batch():
    stream, calls = MemoryStream("prompts", max_deliveries=MAX), []
    stream.publish([_prompt(i) for i in range(4)])
    done = _drain(stream, lambda: stream.consume("w", 4), _failing_on({"g2"}, calls), _ack_after(stream))
    assert done == 3 and stream.backlog() == 0
    assert calls.count("g2") == 1 + MAX  # once in the failed batch, then alone on each of its MAX deliveries
    assert [(r.group_id, reason) for _, r, reason in stream.dead] == [
        (
            "g2",
            f"delivered {MAX} times without an ack (max_deliveries={MAX}); last error: RuntimeError: verifier exploded",
        )
    ]


def test_memory_stream_an_entry_whose_consumer_keeps_dying_is_dead_lettered():
    stream = MemoryStream("prompts", max_deliveries=MAX)
    stream.publish([_prompt(0)])
    stream.consume("w", 1)  # the consumer dies holding it
    for _ in range(MAX):
        stream.requeue_pending()  # its successor re-reads it ...
        stream.consume("w", 1)  # ... and dies again
    assert stream.backlog() == 0 and "its consumer died or stalled on it each time" in stream.dead[0][2]


@pytest.mark.redis
@pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed")
def test_redis_stream_a_failing_entry_is_dead_lettered_with_its_last_error_and_spares_its_batch(tmp_path: Path):
    with redis_server(tmp_path) as server:
        t = RedisTransport.connect(server.url, "p", block_ms=200, max_deliveries=MAX)
        calls: list[str] = []
        t.prompts.publish([_prompt(i) for i in range(4)])
        done = _drain(t.prompts, lambda: t.prompts.consume("w", 4), _failing_on({"g2"}, calls), _ack_after(t.prompts))
        dead = t.prompts.dead_letters()
        backlog = t.prompts.backlog()
        leftover = t.client.hlen(t.prompts.failures_key)
        t.close()
    assert done == 3 and backlog == 0 and leftover == 0
    assert calls.count("g2") == 1 + MAX
    assert len(dead) == 1 and PromptTask.from_fields({k.encode(): v for k, v in dead[0].raw.items()}).group_id == "g2"
    assert dead[0].reason == (
        f"delivered {MAX} times without an ack (max_deliveries={MAX}); last error: RuntimeError: verifier exploded"
    )


@pytest.mark.redis
@pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed")
def test_redis_stream_an_entry_that_kills_each_restarted_consumer_is_dead_lettered(tmp_path: Path):
    with redis_server(tmp_path) as server:
        RedisTransport.connect(server.url, "p", block_ms=200).prompts.publish([_prompt(0), _prompt(1)])
        held = []
        for _ in range(MAX + 1):  # each a fresh process's stream under the same name, dying without an ack
            t = RedisTransport.connect(server.url, "p", block_ms=200, max_deliveries=MAX)
            held.append([d.record.group_id for d in t.prompts.consume("rollout-0", 1)])
            t.close()
        t = RedisTransport.connect(server.url, "p", block_ms=200, max_deliveries=MAX)
        dead = t.prompts.dead_letters()
        after = [d.record.group_id for d in t.prompts.consume("rollout-0", 4)]
        t.close()
    assert held == [["g0"]] * MAX + [["g1"]]  # the (MAX+1)th delivery of g0 parks it, g1 comes next
    assert [d.reason for d in dead] == [
        f"delivered {MAX} times without an ack (max_deliveries={MAX}); its consumer died or stalled on it each time"
    ]
    assert after == ["g1"]
