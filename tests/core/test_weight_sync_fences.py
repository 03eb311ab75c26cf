"""The weight sync's stream fences on a CPU: the real publisher and subscriber over the loopback group, on
a fake device that runs stream work late and in the worst order the fences allow
(stare.weight_sync.fake_streams). What a GPU may show only sometimes, it shows every time."""

from __future__ import annotations

import threading
import time

import pytest

from stare.weight_sync.fake_streams import FakeStreams, Stuck
from stare.weight_sync.fence_check import _ends, back_to_back, send_while_training, weights


def test_two_versions_back_to_back_never_mix_in_the_engines_copies():
    fake = FakeStreams()
    result = back_to_back(fake, finish=fake.drain)
    assert result.clean, result.mixed


def test_without_the_fences_the_second_receive_overwrites_the_set_the_engine_still_copies_from():
    # the control: the same scenario with the subscriber's fences removed mixes every weight of version 1
    fake = FakeStreams()
    result = back_to_back(fake, fenced=False, finish=fake.drain)
    assert sorted(result.mixed[1]) == ["embed.weight", "head.weight", "layer.0.bias", "layer.0.weight"]
    assert result.mixed[2] == []


def test_a_background_send_completes_while_the_learners_next_step_is_held_and_sends_the_snapshot():
    fake = FakeStreams()

    def finish():
        fake.release_all()
        fake.drain()

    result = send_while_training(
        fake, busy=lambda s: fake.hold(s) or s, is_busy=lambda s: s.held_from is not None, finish=finish
    )
    assert result.sent_while_busy and result.bytes_ok


def test_the_learners_stream_never_waits_for_a_send():
    # every stream but the learner's held once the sender has started: the learner's work must still run
    fake = FakeStreams()

    learner = fake.default  # the learner trains on the default stream, which every thread shares
    pub, sub = _ends(fake)
    try:
        params = weights(1, fake.device)
        with fake.use(learner):
            pub.publish(1, params)  # a first version forms the group and makes the publish stream
        assert pub.wait_idle(10)
        for stream in list(fake._streams):
            if stream is not learner:
                fake.hold(stream)
        with fake.use(learner):
            pub.publish(2, {k: v + 1 for k, v in params.items()})
        deadline = time.monotonic() + 10
        while not fake.waiting:  # the sender thread has enqueued version 2's first sends and waits for them
            assert time.monotonic() < deadline, "the sender never waited for its sends"
            time.sleep(0.01)
        started = threading.Event()
        fake.enqueue(started.set, "the next optimizer step", learner)
        fake.drain([learner])  # Stuck if the learner's work waited for anything held
        assert started.is_set()
    finally:
        fake.release_all()
        pub.close()
        sub.close()


def test_the_fake_device_refuses_a_host_wait_that_nothing_can_satisfy():
    fake = FakeStreams(stall_s=0.2)
    s = fake.new_stream()
    fake.hold(s)
    fake.enqueue(lambda: None, "held work", s)
    with pytest.raises(Stuck, match="nothing can run"):
        fake.synchronize(fake.record(s))
