from test_records import make_trajectory

from stare.learner.groups import GroupCollector
from stare.transport.memory import MemoryStream


def _group(gid, rewards, version=0, prefix="t"):
    return [make_trajectory(trajectory_id=f"{prefix}{gid}-{i}", group_id=gid, group_size=len(rewards),
                            reward=r, weight_version=version) for i, r in enumerate(rewards)]


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
