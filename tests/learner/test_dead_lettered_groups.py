"""A group whose prompt or one of whose trajectories was dead-lettered can never complete: the
collector learns it from the dead-letter streams (real Redis streams) and closes it, counted, so an
on-policy learner never waits for it; a restarted collector does not count it again."""

import pytest
from record_helpers import make_trajectory
from redis_fixtures import have_redis_server, redis_server

from learner.loop.group_collector import GroupCollector, RedisDecisionLog
from stare.transport.dead_letters import training_dead_letters
from stare.transport.records import PromptTask
from stare.transport.redis_transport import RedisTransport

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not have_redis_server(), reason="needs redis-server on PATH")]


def _prompt(group_id: str) -> PromptTask:
    return PromptTask(
        run_id="r",
        group_id=group_id,
        prompt="1+1",
        prompt_token_ids=[5, 6],
        answer="2",
        problem_id="p",
        data_source="s",
        group_size=2,
    )


def _group(group_id: str) -> list:
    return [
        make_trajectory(
            run_id="r",
            trajectory_id=f"{group_id}:{j}",
            group_id=group_id,
            group_size=2,
            reward=float(j),
            weight_version=0,
        )
        for j in range(2)
    ]


def _collector(transport) -> GroupCollector:
    return GroupCollector(
        transport.scored,
        name="learner",
        dynamic_sampling=False,
        max_staleness=0,
        decisions=RedisDecisionLog(transport.client, "r"),
        dead_letters=training_dead_letters(transport),
    )


def test_dead_lettered_prompt_and_trajectory_close_their_groups_once(tmp_path):
    with redis_server(tmp_path / "redis") as server:
        t = RedisTransport.connect(server.url, "r")
        ok, half, lost = _group("g000000000"), _group("g000000001"), "g000000002"
        # the rollout worker rejects one prompt; a reward worker parks one trajectory of g1
        t.prompts.publish([_prompt(lost), _prompt("poison-not-ours")])
        for d in t.prompts.consume("rollout-0", 10):
            t.prompts.dead_letter(d.id, d.record, "prompt too long")
        t.raw.publish(half[1:])
        [d] = t.raw.consume("reward-0", 10)
        t.raw.dead_letter(d.id, d.record, "RecordError: bad")
        t.scored.publish(ok + half[:1])
        collector = _collector(t)
        collector.pull(0)
        assert [g[0][0].group_id for g in collector.ready] == ["g000000000"]
        assert collector.stats.dead_lettered_groups == 2
        assert "g000000001" in collector.finished and lost in collector.finished
        assert "poison-not-ours" not in collector.finished and len(collector.finished) == 2
        assert t.scored.backlog() == 2  # g1's arrived trajectory acknowledged; g0's two held for training
        # a restart: the decisions log holds the closed groups; the dead letters are read again, not recounted
        again = _collector(RedisTransport.connect(server.url, "r"))
        again.pull(0)
        assert again.stats.dead_lettered_groups == 0
        assert "g000000001" in again.finished and lost in again.finished and "g000000000" not in again.finished
        t.close()
        again.scored.client.close()
