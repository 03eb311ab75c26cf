"""A `stare up` run (real processes, a real redis-server) fed poison: an over-long prompt
(data.prompt_overflow=reject), a prompt that makes its rollout worker raise every time it is
sampled (group_size 0), and a trajectory that breaks the wire invariants. All three end in the
run's dead-letter streams with their reasons (the raising one after system.max_deliveries
deliveries, with its last error), no role restarts, and the run finishes every step. The poison is
written with the run's record key, as a faulty role of the run would write it (a record without it is
dead-lettered as untrusted before anything else: tests/core/test_record_trust.py)."""

from __future__ import annotations

import json
import time

import pytest
import redis
from redis_fixtures import have_redis_server
from test_up import Run, _config

from stare.transport.record_tag import RECORD_KEY_FILE_ENV, RecordCodec, record_key, tag
from stare.transport.records import PromptTask

pytestmark = [
    pytest.mark.slow,
    pytest.mark.redis,
    pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed"),
]

LIMIT = 64
MAX_DELIVERIES = 3


def test_a_poison_prompt_and_a_poison_trajectory_are_dead_lettered_and_the_run_finishes(tiny_model_dir, tmp_path):
    steps = 4
    cfg = _config(
        tiny_model_dir,
        tmp_path,
        steps,
        data__max_prompt_len=LIMIT,
        data__prompt_overflow="reject",
        system__max_deliveries=MAX_DELIVERIES,
    )
    long_prompt = PromptTask(
        run_id="up",
        group_id="poison-prompt",
        prompt="x",
        prompt_token_ids=[5] * (LIMIT + 1),
        answer="1",
        problem_id="poison",
        data_source="test",
        group_size=4,
    )
    raising_prompt = PromptTask(
        run_id="up",
        group_id="poison-raises",
        prompt="x",
        prompt_token_ids=[5, 6],
        answer="1",
        problem_id="poison",
        data_source="test",
        group_size=0,
    )
    # decodes as JSON but breaks the wire invariants (2 log-probs for 3 response tokens)
    bad_trajectory = {"json": json.dumps({"schema": 2, "run_id": "up", "trajectory_id": "poison:0"}).encode()}
    with Run(cfg, rollout=1, reward=1, control=False) as run:
        run.wait_for_step(1)
        client = redis.Redis.from_url(run.launcher.redis_url, socket_timeout=10)
        env = {RECORD_KEY_FILE_ENV: str(run.launcher.record_key_file)}
        key, _ = record_key("up", run.launcher.redis_url, environ=env)
        prompts = RecordCodec(PromptTask, key, "stare:up:stream:prompts")
        client.xadd("stare:up:stream:prompts", prompts.encode(long_prompt))
        client.xadd("stare:up:stream:prompts", prompts.encode(raising_prompt))
        client.xadd("stare:up:stream:raw", {**bad_trajectory, "tag": tag(key, "stare:up:stream:raw", bad_trajectory)})
        deadline = time.monotonic() + 120
        while client.xlen("stare:up:dead:prompts") < 2 or client.xlen("stare:up:dead:raw") < 1:
            assert time.monotonic() < deadline, f"nothing dead-lettered in 120 s\n{run.tail()}"
            time.sleep(0.2)
        dead_prompts = {
            json.loads(f[b"raw:json"])["group_id"]: f[b"reason"].decode()
            for _, f in client.xrange("stare:up:dead:prompts")
        }
        dead_trajectory = client.xrange("stare:up:dead:raw")[0][1]
        client.close()
        run.wait_finished()
        restarts = {name: r.restarts for name, r in run.launcher.roles.items()}
    assert restarts == dict.fromkeys(restarts, 0), restarts
    assert set(dead_prompts) == {"poison-prompt", "poison-raises"}
    assert dead_prompts["poison-prompt"].startswith(f"prompt has {LIMIT + 1} tokens, over the limit of {LIMIT}")
    assert dead_prompts["poison-raises"] == (
        f"delivered {MAX_DELIVERIES} times without an ack (max_deliveries={MAX_DELIVERIES}); "
        "last error: ValueError: SamplingParams.n must be >= 1, got 0"
    )
    assert b"poison:0" in dead_trajectory[b"raw:json"] and b"RecordError" in dead_trajectory[b"reason"]
    metrics = [json.loads(line) for line in (tmp_path / "up" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))


def test_an_on_policy_run_does_not_wait_for_groups_whose_prompts_were_dead_lettered(tiny_model_dir, tmp_path):
    # The engine's room for a prompt is max_model_len (128) - max_new_tokens (121) = 7 tokens, and the
    # policy rejects longer ones: the rollout worker dead-letters the feeder's 8- and 9-token prompts
    # (about a third of them). Strictly on-policy, a step waits for every group of its round: the
    # collector must learn of those groups from the dead-letter stream and close them.
    steps = 3
    cfg = _config(
        tiny_model_dir,
        tmp_path,
        steps,
        rollout__max_new_tokens=121,
        data__prompt_overflow="reject",
        system__max_staleness=0,
    )
    with Run(cfg, rollout=1, reward=1, control=False) as run:
        run.wait_finished(timeout_s=240)
        restarts = {name: r.restarts for name, r in run.launcher.roles.items()}
        client = redis.Redis.from_url(run.launcher.redis_url, socket_timeout=10)
        reasons = {f[b"reason"].decode() for _, f in client.xrange("stare:up:dead:prompts")}
        client.close()
    assert restarts == dict.fromkeys(restarts, 0), restarts
    assert reasons and all(r.startswith("prompt has") and "over the limit of 7" in r for r in reasons), reasons
    metrics = [json.loads(line) for line in (tmp_path / "up" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    assert metrics[-1]["dead_lettered_groups_total"] >= 1
