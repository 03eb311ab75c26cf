import numpy as np
import pytest
from record_helpers import make_trajectory
from redis_fixtures import have_redis_server, redis_server

from learner.loop.group_collector import GroupCollector, MemoryDecisionLog
from stare.transport.in_memory import MemoryStream


def _group(gid, rewards, version=0, prefix="t"):
    return [
        make_trajectory(
            trajectory_id=f"{prefix}{gid}-{i}", group_id=gid, group_size=len(rewards), reward=r, weight_version=version
        )
        for i, r in enumerate(rewards)
    ]


def test_group_is_ready_only_when_complete():
    s = MemoryStream("scored")
    c = GroupCollector(s, name="l", dynamic_sampling=False)
    g = _group("a", [1.0, 0.0, 1.0])
    s.publish(g[:2])
    c.pull(0)
    assert c.ready == []
    s.publish(g[2:])
    c.pull(0)
    assert len(c.ready) == 1


def test_redelivered_trajectory_is_never_collected_twice():
    s = MemoryStream("scored")
    c = GroupCollector(s, name="l", dynamic_sampling=False)
    g = _group("a", [1.0, 0.0])
    s.publish(g + [g[0]])  # a redelivery of the first one
    c.pull(0)
    trajectories, _ = c.take(10)
    assert sorted(t.trajectory_id for t in trajectories) == ["ta-0", "ta-1"] and c.stats.duplicates == 1


def test_dynamic_sampling_filters_equal_reward_groups_and_acks_them():
    s = MemoryStream("scored")
    c = GroupCollector(s, name="l", dynamic_sampling=True)
    s.publish(_group("same", [1.0, 1.0]) + _group("mixed", [1.0, 0.0]))
    c.pull(0)
    trajectories, ids = c.take(10)
    assert {t.group_id for t in trajectories} == {"mixed"} and c.stats.filtered_groups == 1
    s.ack(ids)
    assert s.backlog() == 0


def test_stale_trajectories_are_dropped_beyond_max_staleness():
    s = MemoryStream("scored")
    c = GroupCollector(s, name="l", dynamic_sampling=False, max_staleness=1)
    s.publish(_group("old", [1.0, 0.0], version=3) + _group("ok", [1.0, 0.0], version=4))
    c.pull(5)
    trajectories, _ = c.take(10)
    assert {t.group_id for t in trajectories} == {"ok"}
    assert c.stats.stale_trajectories == 2 and c.stats.staleness == {2: 2, 1: 2}


@pytest.mark.parametrize("keep_stale", [False, True])
def test_a_group_sampled_with_weights_newer_than_the_learners_is_never_trained(keep_stale):
    # a learner restarted from its checkpoint (version 5) while workers still sent version-7 samples
    s = MemoryStream("scored")
    c = GroupCollector(s, name="l", dynamic_sampling=False, max_staleness=1, keep_stale=keep_stale)
    s.publish(_group("future", [1.0, 0.0], version=7) + _group("ok", [1.0, 0.0], version=5))
    c.pull(5)
    trajectories, _ = c.take(10)
    assert {t.group_id for t in trajectories} == {"ok"} and c.stats.stale_groups == 1
    assert "future" in c.finished and s.backlog() == 2  # decided and acknowledged: only "ok" is held


def test_an_entry_handed_back_while_held_is_not_acknowledged():
    s = MemoryStream("scored")
    c = GroupCollector(s, name="l", dynamic_sampling=False)
    g = _group("a", [1.0, 0.0, 1.0])
    s.publish(g[:2])
    c.pull(0)
    s.requeue_pending()  # the transport hands the held entries back (e.g. after a reconnect)
    c.pull(0)
    assert s.backlog() == 2 and c.stats.duplicates == 0  # still pending: a crash now loses nothing


def test_memory_stream_refuses_to_grow_past_maxlen_and_keeps_what_it_has():
    import pytest

    s = MemoryStream("raw", maxlen=2)
    s.publish(_group("a", [1.0, 0.0]))
    with pytest.raises(OverflowError, match="full"):
        s.publish(_group("b", [1.0]))
    assert s.backlog() == 2


def _feeder_group(ordinal, rewards=(1.0, 0.0), version=0):
    gid = f"g{ordinal:09d}"
    return [
        make_trajectory(
            trajectory_id=f"{gid}:{i}", group_id=gid, group_size=len(rewards), reward=r, weight_version=version
        )
        for i, r in enumerate(rewards)
    ]


def test_trained_entries_stay_pending_until_ack_trained():
    s = MemoryStream("scored")
    c = GroupCollector(s, name="l", dynamic_sampling=False)
    s.publish(_feeder_group(0))
    c.pull(0)
    trajectories, ids = c.take(1)
    c.trained(trajectories, ids)
    s.requeue_pending()  # a reconnect replays them: still ours, neither retrained nor acknowledged
    c.pull(1)
    assert c.ready == [] and s.backlog() == 2 and c.stats.duplicates == 0
    assert c.ack_trained() == 2 and s.backlog() == 0


def test_an_entry_handed_back_while_its_group_is_in_a_step_is_neither_acknowledged_nor_counted():
    s = MemoryStream("scored")
    c = GroupCollector(s, name="l", dynamic_sampling=False)
    s.publish(_feeder_group(0))
    c.pull(0)
    trajectories, ids = c.take(1)  # taken for a step, not yet reported trained
    s.requeue_pending()
    c.pull(0)
    assert s.backlog() == 2 and c.stats.duplicates == 0 and c.ready == []
    c.trained(trajectories, ids)
    assert c.ack_trained() == 2 and s.backlog() == 0 and c.held == set()


def test_a_learner_restarted_from_its_checkpoint_retrains_exactly_what_the_checkpoint_lacks():
    s = MemoryStream("scored")
    c = GroupCollector(s, name="l", dynamic_sampling=False)
    s.publish(_feeder_group(0) + _feeder_group(1))
    c.pull(0)
    first, ids0 = c.take(1)
    c.trained(first, ids0)
    checkpoint = c.state_dict()  # the checkpoint holds group 0's update ...
    c.ack_trained()
    second, ids1 = c.take(1)
    c.trained(second, ids1)  # ... but not group 1's: the learner dies before the next checkpoint
    restarted = GroupCollector(s, name="l", dynamic_sampling=False)
    restarted.load_state_dict(checkpoint)
    s.requeue_pending()
    s.publish(_feeder_group(0) + _feeder_group(1))  # and rollout re-sampled both groups meanwhile
    restarted.pull(1)
    again, _ = restarted.take(10)
    assert [t.group_id for t in again] == ["g000000001", "g000000001"] and restarted.stats.duplicates == 4


def test_finished_groups_are_kept_as_a_watermark_plus_the_ones_above_it():
    s = MemoryStream("scored")
    c = GroupCollector(s, name="l", dynamic_sampling=True)
    s.publish(_feeder_group(0, (1.0, 1.0)) + _feeder_group(1, (0.0, 0.0)) + _feeder_group(3, (1.0, 1.0)))
    c.pull(0)
    assert c.state_dict()["finished"] == {"watermark": 2, "above": [3], "other": []}
    s.publish(_feeder_group(1))  # a late copy of a finished group
    c.pull(0)
    assert c.ready == [] and c.stats.duplicates == 2


def test_a_group_older_than_max_staleness_is_dropped_whole_or_kept_for_importance_correction():
    for keep_stale, expected in ((False, []), (True, ["g000000000"] * 2)):
        s = MemoryStream("scored")
        c = GroupCollector(s, name="l", dynamic_sampling=False, max_staleness=1, keep_stale=keep_stale)
        s.publish(_feeder_group(0, version=1))  # lag 2 at learner version 3: every token beyond the bound
        c.pull(3)
        taken, _ = c.take(10, learner_version=3)
        assert [t.group_id for t in taken] == expected and c.stats.stale_groups == (0 if keep_stale else 1)
        assert c.stats.stale_tokens == 0  # importance keeps every token in the loss


def test_a_group_with_a_token_within_max_staleness_is_kept_and_its_older_tokens_leave_the_loss():
    s = MemoryStream("scored")
    c = GroupCollector(s, name="l", dynamic_sampling=False, max_staleness=1)
    old, new = _feeder_group(0, version=1)[:1], _feeder_group(0, version=3)[1:]
    old[0].loss_mask = np.array([1, 1], dtype=np.uint8)
    s.publish(old + new)
    c.pull(3)
    taken, _ = c.take(10, learner_version=3)
    # trajectory 0 (version 1, lag 2) stays for the group's advantages but trains no token; trajectory 1 as it was
    assert [t.loss_mask.tolist() for t in taken] == [[0, 0], [1, 0]]
    assert c.stats.stale_groups == 0 and c.stats.stale_tokens == 2


def test_in_flight_a_trajectorys_tokens_beyond_max_staleness_leave_the_loss_token_by_token():
    s = MemoryStream("scored")
    c = GroupCollector(s, name="l", dynamic_sampling=False, max_staleness=1)
    group = _feeder_group(0, version=1)
    for t in group:  # 5 tokens: 0-1 sampled with version 1, 2-3 with 2, 4 with 3
        t.response_token_ids, t.response_logprobs = np.arange(5, dtype=np.int32), np.full(5, -1.0, dtype=np.float32)
        t.loss_mask, t.version_starts = np.array([1, 1, 1, 0, 1], dtype=np.uint8), [[2, 2], [4, 3]]
    s.publish(group)
    c.pull(3)
    taken, _ = c.take(10, learner_version=3)
    assert [t.loss_mask.tolist() for t in taken] == [[0, 0, 1, 0, 1]] * 2  # lag 2 out; lags 1 and 0 kept
    assert c.stats.stale_tokens == 4 and c.stats.stale_groups == 0
    # a version later its tokens of version 2 are beyond the bound too: the group is then all but its last token
    s2 = MemoryStream("scored")
    c2 = GroupCollector(s2, name="l", dynamic_sampling=False, max_staleness=1)
    s2.publish(_feeder_group(1, version=3))
    c2.pull(4)
    assert c2.take(10, learner_version=4)[0][0].loss_mask.tolist() == [1, 0]  # lag 1: untouched


def test_a_ready_group_expires_only_once_none_of_its_tokens_is_within_max_staleness():
    s = MemoryStream("scored")
    c = GroupCollector(s, name="l", dynamic_sampling=False, max_staleness=1)
    group = _feeder_group(0, version=1)
    for t in group:
        t.response_token_ids, t.response_logprobs = np.arange(3, dtype=np.int32), np.full(3, -1.0, dtype=np.float32)
        t.loss_mask, t.version_starts = np.ones(3, dtype=np.uint8), [[1, 2]]
    s.publish(group)
    c.pull(2)
    c.pull(3)  # newest token version 2: lag 1, still ready
    assert len(c.ready) == 1 and c.stats.stale_groups == 0
    c.pull(4)  # lag 2 for every token: dropped as stale
    assert c.ready == [] and c.stats.stale_groups == 1


def _memory_log():
    yield MemoryDecisionLog()


def _redis_log(tmp_path):
    import redis

    from learner.loop.group_collector import RedisDecisionLog

    with redis_server(tmp_path / "redis") as server:
        yield RedisDecisionLog(redis.Redis.from_url(server.url, socket_timeout=10), "run")


@pytest.mark.parametrize(
    "backend",
    [
        "memory",
        pytest.param(
            "redis",
            marks=[
                pytest.mark.redis,
                pytest.mark.skipif(not have_redis_server(), reason="redis-server is not on PATH"),
            ],
        ),
    ],
)
def test_a_group_filtered_after_the_checkpoint_is_still_finished_after_a_restart(backend, tmp_path):
    logs = _memory_log() if backend == "memory" else _redis_log(tmp_path)
    log = next(logs)
    s = MemoryStream("scored")
    c = GroupCollector(s, name="l", dynamic_sampling=True, decisions=log)
    s.publish(_feeder_group(0))
    c.pull(0)
    c.trained(*c.take(1))
    checkpoint = c.state_dict()
    c.ack_trained()
    s.publish(_feeder_group(1, rewards=(1.0, 1.0)))  # filtered, and acknowledged at once
    c.pull(1)
    assert s.backlog() == 0 and c.stats.filtered_groups == 1
    restarted = GroupCollector(s, name="l", dynamic_sampling=True, decisions=log)  # the learner died
    restarted.load_state_dict(checkpoint)
    assert "g000000001" in restarted.finished and len(restarted.finished) == 2  # not in flight for ever
    later = restarted.state_dict()  # its next checkpoint holds the decision itself ...
    restarted.ack_trained()
    assert log.recorded() == set()  # ... so the log is cleared
    fresh = GroupCollector(s, name="l", dynamic_sampling=True, decisions=log)
    fresh.load_state_dict(later)
    assert len(fresh.finished) == 2
    logs.close()


def test_a_ready_group_that_waits_past_max_staleness_is_dropped_before_it_can_be_taken():
    # completed at learner version 5 with version-4 samples (lag 1: ready); the learner steps twice
    # before taking it: at version 6 its lag is 2 > 1, so the next pull drops it, counted and acknowledged
    s = MemoryStream("scored")
    c = GroupCollector(s, name="l", dynamic_sampling=False, max_staleness=1)
    s.publish(_group("late", [1.0, 0.0], version=4))
    c.pull(5)
    assert len(c.ready) == 1
    c.pull(6)
    assert c.ready == [] and c.stats.stale_groups == 1 and "late" in c.finished and not c.closed
    assert s.backlog() == 0


@pytest.mark.parametrize("in_publish_order", [False, True])
def test_upcoming_names_the_groups_take_hands_out_and_leaves_them_ready(in_publish_order):
    s = MemoryStream("scored")
    c = GroupCollector(s, name="l", dynamic_sampling=False, max_staleness=0)
    for gid in ("g000000003", "g000000001", "g000000002", "g000000000"):  # completion order
        s.publish(_group(gid, [1.0, 0.0]))
    c.pull(0)
    upcoming = c.upcoming(2, in_publish_order)
    assert len(c.ready) == 4  # nothing taken
    trajectories, _ = c.take(2, in_publish_order=in_publish_order)
    assert [t for g in upcoming for t in g] == trajectories
    assert [g[0].group_id for g in upcoming] == (
        ["g000000000", "g000000001"] if in_publish_order else ["g000000003", "g000000001"]
    )


def test_take_in_publish_order_then_drop_ready_counts_the_surplus():
    s = MemoryStream("scored")
    c = GroupCollector(s, name="l", dynamic_sampling=False, max_staleness=0)
    for gid in ("g000000003", "g000000001", "g000000002", "g000000000"):  # completion order
        s.publish(_group(gid, [1.0, 0.0]))
    c.pull(0)
    trajectories, _ = c.take(2, in_publish_order=True)
    assert [t.group_id for t in trajectories][::2] == ["g000000000", "g000000001"]
    assert c.drop_ready() == 2 and c.stats.surplus_groups == 2 and c.ready == []
    assert "g000000002" in c.finished and "g000000003" in c.finished
    assert c.closed == {"g000000000", "g000000001"}  # taken: finished once trained
    assert s.backlog() == 4  # only the taken entries stay pending (acknowledged after the step's checkpoint)


def test_round_size_over_samples_the_missing_groups_and_a_later_round_by_the_steps_yield():
    from learner.loop.group_collector import round_size

    assert round_size(64, 1.0) == 64 and round_size(5, 1.0, trainable=59, filtered=20) == 5  # 1.0: the missing
    assert round_size(64, 1.5) == 96  # a first round: ceil(64 x 1.5)
    # a later round: 48 trainable of 96 so far (yield 1/2): ceil(16 x 1.5 x 2) = 48
    assert round_size(16, 1.5, trainable=48, filtered=48) == 48
    assert round_size(10, 1.5, trainable=0, filtered=96) == 150  # nothing trainable yet: at most 10x
    assert round_size(-3, 1.5, trainable=67) <= 0  # more than a step in flight: nothing to publish


def test_a_trajectorys_trained_lag_is_its_oldest_token_still_in_the_loss():
    from stare.observe.run_outputs import trained_lags

    one, spanning = _feeder_group(0, version=3)
    spanning.response_token_ids, spanning.response_logprobs = np.arange(4, dtype=np.int32), np.full(4, -1.0, np.float32)
    spanning.weight_version, spanning.version_starts = 1, [[2, 2]]  # tokens 0-1 at version 1, 2-3 at 2
    spanning.loss_mask = np.array([1, 1, 1, 1], dtype=np.uint8)
    assert trained_lags([one, spanning], 3) == {0: 1, 2: 1}  # its oldest token: version 1
    spanning.loss_mask = np.array([0, 0, 1, 1], dtype=np.uint8)  # the version-1 tokens left the loss (too stale)
    assert trained_lags([one, spanning], 3) == {0: 1, 1: 1}
