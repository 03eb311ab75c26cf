"""The bucketed weight broadcast (one implementation, gloo here), background publishing and the
communicator choice."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import pytest
import torch
from broadcast_helpers import TIMEOUT_S
from broadcast_helpers import await_join_request as _await_join_request
from broadcast_helpers import subscriber as _subscriber

from stare.runtime.net import free_port
from stare.weight_sync.background import BackgroundPublisher
from stare.weight_sync.broadcast import BroadcastPublisher, BroadcastSubscriber
from stare.weight_sync.buckets import BucketPacker, Segments
from stare.weight_sync.communicator import GlooCommunicator, NcclCommunicator, choose_communicator, has_nccl
from stare.weight_sync.in_memory import MemoryWeightBoard


def _state(shift: float) -> dict[str, torch.Tensor]:
    """Mixed dtypes and sizes: a 4000-byte tensor (larger than the small buckets), odd byte counts,
    a non-contiguous view, a 0-d and an empty tensor."""
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(40, 25, generator=g) + shift,  # 4000 bytes
        "layer.bias": torch.arange(3, dtype=torch.float32) + shift,
        "half.weight": (torch.randn(7, 3, generator=g) + shift).to(torch.bfloat16),  # 42 bytes
        "steps": torch.tensor([int(shift), 5, 9], dtype=torch.int64),
        "scale": torch.tensor(shift + 0.5, dtype=torch.float64),  # 0-d
        "empty": torch.zeros(0, 4),
        "transposed": (torch.randn(6, 5, generator=g) + shift).t(),  # not contiguous
    }


def _same(a: Mapping, b: Mapping) -> bool:
    return list(a) == list(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a
    )


class OnePassOnly(Mapping):
    """A state that may be iterated once, in order, and never indexed (what a lazy mapping that
    produces its tensors one at a time allows); it tells its names, shapes and dtypes up front."""

    def __init__(self, state: dict[str, torch.Tensor]):
        self._state, self.passes = state, 0

    def meta(self):
        return [(k, v.shape, v.dtype) for k, v in self._state.items()]

    def items(self):
        self.passes += 1
        assert self.passes == 1, "the state was iterated twice"
        return iter(list(self._state.items()))

    def __getitem__(self, key):
        raise AssertionError(f"the state was indexed by {key!r}")

    def __iter__(self):
        raise AssertionError("the state's keys were iterated apart from its items")

    def __len__(self):
        return len(self._state)


def _publisher(bucket_bytes: int) -> BroadcastPublisher:
    return BroadcastPublisher(
        "127.0.0.1", free_port(), timeout_s=TIMEOUT_S, communicator="gloo", bucket_bytes=bucket_bytes
    )


@pytest.mark.parametrize("bucket_bytes", [64, 256, 1024, 1 << 20])
def test_every_bucket_size_delivers_bit_identical_weights_from_one_pass(bucket_bytes):
    pub = _publisher(bucket_bytes)
    subs = [_subscriber(pub, "w0"), _subscriber(pub, "w1")]
    try:
        _await_join_request(pub, 2)
        for version in (1, 2, 3):
            one_pass = OnePassOnly(_state(version))
            pub.publish(version, one_pass)
            assert one_pass.passes == 1 and pub.failures == 0
            for sub in subs:
                assert sub.wait_for(version, 10)
                got_version, got = sub.fetch(version - 1)
                assert got_version == version and _same(got, _state(version))
        assert all(s.communicator == "gloo" for s in subs)
    finally:
        for sub in subs:
            sub.close()
        pub.close()


def test_a_tensor_larger_than_a_bucket_is_sent_from_its_own_memory_in_bucket_chunks():
    big = torch.arange(1000, dtype=torch.float32)  # 4000 bytes
    state = {"small": torch.ones(3), "big": big, "none": torch.zeros(0), "tail": torch.zeros(2)}
    packer = BucketPacker(1024, torch.device("cpu"))
    layout = packer.layout(state)
    # segments: [small] 12 B, [big] 4000 B, [tail] 8 B (the big one closes the open bucket); empty: none
    assert layout.segments == [12, 4000, 8]
    assert layout.messages() == [(0, 0, 12), (1, 0, 1024), (1, 1024, 1024), (1, 2048, 1024), (1, 3072, 928), (2, 0, 8)]
    msgs = list(packer.messages(state, layout))
    assert [(m.segment, m.start, m.payload.numel()) for m in msgs] == layout.messages()  # no header message
    base = big.untyped_storage().data_ptr()
    assert [m.payload.data_ptr() - base for m in msgs[1:5]] == [0, 1024, 2048, 3072]  # no copy
    # the receiver's view of the same messages: three segments, every tensor a view of one
    segments = Segments(torch.device("cpu"))
    for target, m in zip(segments.targets(layout), msgs, strict=True):
        target.copy_(m.payload)
    got = segments.tensors(layout)
    assert len(segments.buffers) == 3 and torch.equal(got["big"], big) and torch.equal(got["tail"], torch.zeros(2))
    assert got["none"].shape == (0,) and torch.equal(got["small"], torch.ones(3))


def test_a_state_that_differs_from_its_layout_is_refused_naming_the_tensor():
    packer = BucketPacker(1024, torch.device("cpu"))
    layout = packer.layout({"a": torch.ones(3), "b": torch.ones(2)})
    with pytest.raises(ValueError, match=r"weight b \[3\]"):
        list(packer.messages({"a": torch.ones(3), "b": torch.ones(3)}, layout))


def test_a_dead_member_is_skipped_mid_version_and_rejoins_with_small_buckets():
    pub = _publisher(128)  # dozens of messages per version
    alive, doomed = _subscriber(pub, "alive"), _subscriber(pub, "doomed")
    try:
        _await_join_request(pub, 2)
        pub.publish(1, _state(1))
        assert alive.wait_for(1, 10) and doomed.wait_for(1, 10)
        doomed.close()
        t0 = time.monotonic()
        pub.publish(2, _state(2))
        assert time.monotonic() - t0 < TIMEOUT_S + 2.0 and pub.failures == 1
        assert pub.alive_members == ["alive"] and alive.wait_for(2, 10) and _same(alive.fetch(1)[1], _state(2))
        pub.publish(3, _state(3))  # skipped: no second failure
        assert alive.wait_for(3, 10) and pub.failures == 1
        back = _subscriber(pub, "doomed")
        try:
            _await_join_request(pub, 3)
            pub.publish(4, _state(4))
            assert back.wait_for(4, 10) and alive.wait_for(4, 10) and pub.members == ["alive", "doomed"]
            assert _same(back.fetch(0)[1], _state(4)) and _same(alive.fetch(3)[1], _state(4))
        finally:
            back.close()
    finally:
        alive.close()
        pub.close()


def test_a_worker_keeps_at_most_two_buffer_sets_and_an_untaken_version_is_replaced_by_the_newer():
    pub = _publisher(256)
    sub = _subscriber(pub, "w0")
    try:
        _await_join_request(pub, 1)
        pub.publish(1, _state(1))
        assert sub.wait_for(1, 10)
        held = sub.fetch(0)[1]  # the rollout loop holds version 1 while 2..5 arrive
        for version in (2, 3, 4, 5):
            pub.publish(version, _state(version))
            assert sub.wait_for(version, 10)
        assert len(sub._pool) == 2 and _same(held, _state(1))  # what it holds was never overwritten
        version, got = sub.fetch(1)
        assert version == 5 and _same(got, _state(5))
    finally:
        sub.close()
        pub.close()


def test_with_one_buffer_set_a_receive_waits_until_the_loop_releases_the_set_it_took():
    pub = _publisher(256)
    sub = BroadcastSubscriber("127.0.0.1", pub.store.port, "w0", timeout_s=TIMEOUT_S, poll_s=0.01, buffer_sets=1)
    try:
        _await_join_request(pub, 1)
        pub.publish(1, _state(1))
        assert sub.wait_for(1, 10)
        held = sub.fetch(0)[1]  # the rollout loop takes version 1 (in flight: between two engine steps)
        sent = threading.Thread(target=pub.publish, args=(2, _state(2)))
        sent.start()
        time.sleep(0.5)  # the broadcast of version 2 is under way: its receive waits for the set
        assert sub.received == 1 and _same(held, _state(1))  # version 1 untouched while the loop holds it
        assert sub.fetch(1) is None  # the loop's next fetch: nothing newer yet, and the set it took is released
        sent.join(timeout=10)
        assert not sent.is_alive() and sub.wait_for(2, 10)
        version, got = sub.fetch(1)
        assert version == 2 and _same(got, _state(2)) and len(sub._pool) == 1
    finally:
        sub.close()
        pub.close()


def test_with_one_buffer_set_a_loop_that_never_releases_it_fails_the_receive_after_the_timeout():
    pub = _publisher(256)
    sub = BroadcastSubscriber("127.0.0.1", pub.store.port, "w0", timeout_s=1.0, poll_s=0.01, buffer_sets=1)
    try:
        _await_join_request(pub, 1)
        pub.publish(1, _state(1))
        assert sub.wait_for(1, 10)
        sub.fetch(0)  # taken and never released
        with pytest.raises(RuntimeError, match="receive buffer set"):
            sub._free_buffers(GlooCommunicator())
    finally:
        sub.close()
        pub.close()


class GatedBoard(MemoryWeightBoard):
    """The in-memory publisher, each publish held until the test opens the gate; records the order."""

    def __init__(self):
        super().__init__()
        self.gate, self.started, self.sent = threading.Event(), threading.Event(), []

    def publish(self, version, state_dict):
        self.started.set()
        assert self.gate.wait(10), "the gate never opened"
        super().publish(version, state_dict)
        self.sent.append(version)


def test_background_publish_returns_before_the_sync_and_never_sends_an_older_version_after_a_newer():
    board = GatedBoard()
    pub = BackgroundPublisher(board, close_timeout_s=10)
    t0 = time.monotonic()
    pub.publish(1, _state(1))
    assert board.started.wait(5)  # version 1 is being sent and blocked
    for version in (2, 3, 4):
        pub.publish(version, _state(version))  # 2 and 3 wait in turn, each replaced by the next
    assert time.monotonic() - t0 < 5.0 and board.sent == []  # the learner did not wait (the gate is shut)
    with pytest.raises(ValueError, match="must increase"):
        pub.publish(4, _state(4))
    board.gate.set()
    assert pub.wait_idle(10)
    assert board.sent == [1, 4] and pub.superseded == 2 and pub.sent_version == 4 and pub.last_sync_s >= 0
    assert _same(board.fetch(0)[1], _state(4))
    pub.close()


def test_background_publish_raises_a_sender_error_on_the_next_call():
    class Broken(MemoryWeightBoard):
        def publish(self, version, state_dict):
            raise OSError("disk full")

    pub = BackgroundPublisher(Broken(), close_timeout_s=5)
    pub.publish(1, _state(1))
    assert pub.wait_idle(5)
    with pytest.raises(RuntimeError, match="disk full"):
        pub.publish(2, _state(2))
    pub.close()


@pytest.mark.parametrize(
    "setting, learner, members, expected",
    [
        ("auto", "G0", {"a": "G1", "b": "G2"}, ("nccl", [])),
        ("auto", "G0", {"a": "G1", "b": None}, ("gloo", [])),  # one CPU worker: gloo for everyone
        ("auto", "G0", {"a": "G0"}, ("gloo", [])),  # one GPU for learner and worker: NCCL would refuse
        ("auto", "G0", {"a": "G1", "b": "G1"}, ("gloo", [])),
        ("auto", None, {"a": "G1"}, ("gloo", [])),
        ("auto", "G0", {}, ("gloo", [])),
        ("gloo", "G0", {"a": "G1"}, ("gloo", [])),
        (
            "nccl",
            "G0",
            {"a": "G1", "b": None, "c": "G0", "d": "G1"},
            ("nccl", ["b", "c", "d"]),
        ),  # forced: they stay out
    ],
)
def test_the_communicator_is_nccl_only_when_every_end_has_a_gpu_of_its_own(setting, learner, members, expected):
    assert choose_communicator(setting, learner, members) == expected


def test_forcing_nccl_without_cuda_is_refused_naming_the_field():
    if has_nccl():
        pytest.skip("this machine has CUDA and NCCL")
    with pytest.raises(ValueError, match="weight_sync_communicator is nccl but the learner"):
        choose_communicator("nccl", None, {"a": "G1"})
    with pytest.raises(RuntimeError, match="system.weight_sync_communicator"):
        NcclCommunicator()
    with pytest.raises(RuntimeError, match="system.weight_sync_communicator is nccl but no CUDA"):
        BroadcastPublisher("127.0.0.1", free_port(), communicator="nccl")
    with pytest.raises(RuntimeError, match="system.weight_sync_communicator is nccl but no CUDA"):
        BroadcastSubscriber("127.0.0.1", free_port(), "w0", communicator="nccl")


def test_auto_forms_a_gloo_group_when_learner_and_worker_have_no_gpu_of_their_own():
    pub = BroadcastPublisher("127.0.0.1", free_port(), timeout_s=TIMEOUT_S)  # auto
    sub = _subscriber(pub, "w0")
    try:
        _await_join_request(pub, 1)
        pub.publish(1, _state(1))
        assert sub.wait_for(1, 10)
        assert pub.communicator == "gloo"  # one process: no GPU, or the same one for both ends
    finally:
        sub.close()
        pub.close()


def test_a_tensor_parallel_vllm_worker_takes_gloo_under_auto_and_nccl_is_refused_naming_both_fields():
    from stare.config import load_config
    from stare.weight_sync.factory import communicator_setting

    def cfg(tp, setting):
        return load_config(
            None,
            overrides=[
                "rollout.engine.name=vllm",
                f"rollout.engine.tensor_parallel_size={tp}",
                f"system.weight_sync_communicator={setting}",
            ],
        )

    assert communicator_setting(cfg(1, "auto"), rollout_end=True) == "auto"
    assert communicator_setting(cfg(2, "auto"), rollout_end=True) == "gloo"
    assert communicator_setting(cfg(2, "auto"), rollout_end=False) == "auto"  # the learner: what its members can
    with pytest.raises(ValueError, match="weight_sync_communicator: nccl needs rollout.engine.tensor_parallel_size 1"):
        communicator_setting(cfg(2, "nccl"), rollout_end=False)


def test_a_version_reads_nothing_back_on_the_receiver_its_layout_comes_from_the_store():
    """The receiver's host syncs per version are O(1): it never reads a received tensor's values
    (no header tensor; `.tolist()`/`.item()` on a GPU would each sync the stream)."""
    reads = {"tolist": 0, "item": 0}
    real_tolist, real_item = torch.Tensor.tolist, torch.Tensor.item

    def counted(name, real):
        def read(self, *args):
            reads[name] += 1
            return real(self, *args)

        return read

    pub = _publisher(64)  # many messages per version
    sub = _subscriber(pub, "w0")
    try:
        _await_join_request(pub, 1)
        pub.publish(1, _state(1))
        assert sub.wait_for(1, 10)
        torch.Tensor.tolist, torch.Tensor.item = counted("tolist", real_tolist), counted("item", real_item)
        try:
            pub.publish(2, _state(2))
            assert sub.wait_for(2, 10)
        finally:
            torch.Tensor.tolist, torch.Tensor.item = real_tolist, real_item
        assert _same(sub.fetch(1)[1], _state(2))
        assert reads == {"tolist": 0, "item": 0}
        assert len(sub._layout(pub.store, pub.generation, 0).messages()) > 10  # and the version took many messages
    finally:
        sub.close()
        pub.close()


def test_the_nccl_group_is_built_with_its_error_handling_env_and_the_process_env_is_restored(monkeypatch):
    """The NCCL group's constructor sees NCCL_GROUP_ENV (errors stay in the group: no process
    teardown, no dump signal to the learner's DeepSpeed group); the process's own settings, set or
    unset, are back afterwards. ProcessGroupNCCL is replaced by a recorder: no NCCL here."""
    import contextlib
    import os

    import torch.distributed as dist

    from stare.weight_sync import communicator as comm

    seen = {}

    class Recorder:
        Options = type("Options", (), {})

        def __init__(self, store, rank, size, options):
            seen.update({k: os.environ.get(k) for k in comm.NCCL_GROUP_ENV})
            seen["timeout"] = options._timeout.total_seconds()

    monkeypatch.setattr(dist, "ProcessGroupNCCL", Recorder, raising=False)
    monkeypatch.setattr(comm, "nccl_problem", lambda: None)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    monkeypatch.delenv("TORCH_NCCL_DUMP_ON_TIMEOUT", raising=False)
    store = dist.HashStore()
    comm.NcclCommunicator(torch.device("cpu")).group(store, generation=1, rank=0, size=2, timeout_s=7.0)
    assert seen == {
        "TORCH_NCCL_BLOCKING_WAIT": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
        "TORCH_NCCL_ENABLE_MONITORING": "0",
        "timeout": 7.0,
    }
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3" and "TORCH_NCCL_DUMP_ON_TIMEOUT" not in os.environ
