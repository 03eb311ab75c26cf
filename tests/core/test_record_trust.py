"""Records a learner can trust (stare.transport.record_tag, record_limits) on a real redis-server: a record
is read only if the tag its writer made with the run's record key verifies and it keeps the run's bounds;
anything else is dead-lettered with the reason, never delivered, never a crash. A record that failed its
tag closes no group; one that broke a bound closes its group (its writer was a worker of the run)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import redis
from redis_fixtures import have_redis_server, redis_server
from test_redis_transport import traj

from stare.transport.dead_letters import training_dead_letters
from stare.transport.record_limits import RecordLimits
from stare.transport.record_tag import RECORD_KEY_FILE_ENV, RecordTrust, record_key
from stare.transport.records import PromptTask
from stare.transport.redis_transport import RedisTransport

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not have_redis_server(), reason="needs redis-server on PATH")]

VOCAB = 150_000  # traj() draws token ids below it
LIMITS = RecordLimits(max_group_size=4, max_response_tokens=16, context=64, vocab_size=VOCAB)


@pytest.fixture
def url(tmp_path):
    with redis_server(tmp_path / "redis") as server:
        yield server.url


def _transport(url: str, run: str = "r", key: bytes | None = None) -> RedisTransport:
    key = key if key is not None else record_key(run, url, environ={})[0]
    return RedisTransport.connect(url, run, trust=RecordTrust(key, LIMITS, LIMITS), backoff_s=0.02)


def _reasons(stream) -> list[str]:
    return [d.reason for d in stream.dead_letters()]


def test_a_tagged_record_round_trips_and_carries_its_tag(url):
    t = _transport(url)
    t.scored.publish([traj(0)])
    ((entry_id, fields),) = t.client.xrange(t.scored.key)
    assert len(fields[b"tag"]) == 64  # hex HMAC-SHA256
    got = t.scored.consume("learner", 10)
    assert [d.record.trajectory_id for d in got] == ["t0"] and np.array_equal(
        got[0].record.response_token_ids, traj(0).response_token_ids
    )


def test_forged_records_are_dead_lettered_as_untrusted_and_close_no_group(url):
    t = _transport(url)
    client = t.client
    client.xadd(t.scored.key, traj(0).to_fields())  # no tag: written with the Redis password alone
    _transport(url, key=b"k" * 32).scored.publish([traj(1)])  # another key
    _transport(url, run="other").scored.publish([traj(2)])  # another run's key ...
    ((_, other),) = client.xrange("stare:other:stream:scored")
    client.xadd(t.scored.key, other)  # ... copied into this run's stream
    t.raw.publish([traj(3)])  # a genuine raw record copied into the scored stream
    ((_, raw),) = client.xrange(t.raw.key)
    client.xadd(t.scored.key, raw)
    genuine = _transport(url)
    genuine.scored.publish([traj(4)])
    ((_, good),) = client.xrange(t.scored.key, min="-", max="+", count=100)[-1:]
    tampered = dict(good)
    tampered[b"response_token_ids"] = b"\x01" + good[b"response_token_ids"][1:]  # one byte changed
    client.xadd(t.scored.key, tampered)
    assert [d.record.trajectory_id for d in t.scored.consume("learner", 100)] == ["t4"]
    reasons = _reasons(t.scored)
    assert len(reasons) == 5 and all(
        r.startswith("UntrustedRecord: untrusted record on stare:r:stream:scored") for r in reasons
    )
    assert sum("has no tag" in r for r in reasons) == 1 and sum("does not verify" in r for r in reasons) == 4
    assert t.scored.backlog() == 1  # t4, delivered, not acked; the forged ones left the stream
    closes = [d.group_id for d in training_dead_letters(t).new()]
    assert closes == [None] * 5  # a forger cannot close the real groups g0 .. g1 it names


@pytest.mark.parametrize(
    "change, field",
    [
        ({"group_size": 5}, "Trajectory.group_size is 5, beyond this run's 4"),
        (
            {
                "response_token_ids": np.full(17, 7, np.int32),
                "response_logprobs": np.zeros(17, np.float32),
                "loss_mask": np.ones(17, np.uint8),
            },
            "response_token_ids has 17 tokens, beyond the 16",
        ),
        (
            {"prompt_token_ids": np.full(60, 7, np.int32)},
            "60 prompt + 16 response tokens, beyond the model's context of 64",
        ),
        ({"response_token_ids": np.full(16, VOCAB, np.int32)}, f"token id {VOCAB}, outside the model's vocabulary"),
        ({"prompt_token_ids": np.array([3, -1], np.int32)}, "prompt_token_ids has token id -1, outside"),
        ({"loss_mask": np.full(16, 2, np.uint8)}, "loss_mask has value 2"),
    ],
)
def test_a_worker_record_beyond_the_runs_bounds_is_dead_lettered_naming_the_field_and_closes_its_group(
    url, change, field
):
    t = _transport(url)
    record = traj(0)
    for name, value in change.items():
        setattr(record, name, value)
    t.scored.publish([record, traj(1)])
    assert [d.record.trajectory_id for d in t.scored.consume("learner", 10)] == ["t1"]
    (reason,) = _reasons(t.scored)
    assert reason.startswith("RecordError: ") and field in reason
    assert [d.group_id for d in training_dead_letters(t).new()] == ["g0"]  # trusted: its group can never complete


def test_a_prompt_task_asking_for_100000_samples_never_reaches_a_rollout_worker(url):
    t = _transport(url)
    task = PromptTask("r", "g000000007", "1+1", [1, 2], "2", "p", "d", group_size=100_000)
    t.prompts.publish([task, PromptTask("r", "g000000008", "1+2", [1, 3], "3", "p", "d", group_size=4)])
    assert [d.record.group_id for d in t.prompts.consume("rollout-0", 10)] == ["g000000008"]
    (reason,) = _reasons(t.prompts)
    assert "PromptTask.group_size is 100000, beyond this run's 4 (rollout.samples_per_prompt)" in reason


def test_the_record_key_comes_from_the_key_file_else_the_redis_password_and_differs_per_run(tmp_path):
    secret = tmp_path / "record.key"
    secret.write_text("s3cret\n")
    url = "redis://:p%40ss@127.0.0.1:6379/0"
    from_file, source = record_key("r", url, environ={RECORD_KEY_FILE_ENV: str(secret)})
    assert source == RECORD_KEY_FILE_ENV
    from_password, source = record_key("r", url, environ={})
    assert source == "the Redis password" and from_password != from_file
    assert record_key("r", "redis://:p%40ss@other-host:1/0", environ={})[0] == from_password  # the secret, not the URL
    assert record_key("other", url, environ={})[0] != from_password
    assert record_key("r", "redis://127.0.0.1:6379/0", environ={})[1] is None  # nothing secret: said, not hidden


def test_the_run_limits_follow_the_config_and_the_models_config(tiny_model_dir):
    from stare.config import build_config
    from stare.transport.record_limits import run_limits

    cfg = build_config(
        {},
        overrides=[
            f"model.path={tiny_model_dir}",
            "rollout.samples_per_prompt=6",
            "rollout.max_new_tokens=20",
            "task.eval_k=9",
        ],
    )
    training, evaluation = run_limits(cfg)
    model = json.loads((tiny_model_dir / "config.json").read_text())
    assert (training.max_group_size, training.max_response_tokens) == (6, 20)
    assert (training.vocab_size, training.context) == (model["vocab_size"], model["max_position_embeddings"])
    assert evaluation.max_group_size == 9 and evaluation.max_eval_new_tokens == 20
    tools = build_config(
        {},
        overrides=[
            f"model.path={tiny_model_dir}",
            "rollout.max_new_tokens=20",
            "rollout.tool_use.enabled=true",
            "rollout.tool_use.max_turns=3",
            "rollout.tool_use.max_observation_tokens=10",
        ],
    )
    assert run_limits(tools)[0].max_response_tokens == 3 * 20 + 2 * 10


def test_roles_without_any_secret_still_agree_on_a_key():
    """An open Redis (no password, no key file): the key comes from the run id alone, the same in every role,
    so the run works (and says its records are not authenticated)."""
    assert record_key("r", "redis://127.0.0.1:1/0", environ={})[0] == record_key("r", "redis://h:2/0", environ={})[0]


def test_without_trust_the_streams_carry_plain_records_as_before(url):
    t = RedisTransport.connect(url, "r")
    t.scored.publish([traj(0)])
    ((_, fields),) = redis.Redis.from_url(url).xrange(t.scored.key)
    assert b"tag" not in fields and [d.record.trajectory_id for d in t.scored.consume("l", 10)] == ["t0"]
