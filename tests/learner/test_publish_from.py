"""Where the published weights are read from (`system.weight_sync_publish_from`): "device" sends the
parameters' own memory (on CPU the tensors' own device is the CPU: no copy of a large tensor at all),
"host" one copy of each; and how auto resolves. Copies are counted by the bytes aten's copy ops
write (a TorchDispatchMode on the learner's thread), not by timing."""

import pytest
import torch
from broadcast_helpers import await_join_request, subscriber
from learner_helpers import save_random_qwen2, trajectories
from torch.utils._python_dispatch import TorchDispatchMode

from stare.config import build_config
from stare.runtime.net import free_port
from stare.weight_sync.broadcast import BroadcastPublisher
from stare.weight_sync.factory import publish_from

OVERRIDES = [
    "rollout.prompts_per_step=2",
    "rollout.samples_per_prompt=2",
    "optim.micro_batch=4",
    "optim.zero_stage=1",
    "system.max_staleness=0",
]  # a synchronous publish: no snapshot
COPY_OPS = ("aten.copy_", "aten._to_copy", "aten.clone")
BUCKET = 4096  # bytes: the tiny model's larger matrices (8-12 KB) are sent from their own memory


class _CopiedBytes(TorchDispatchMode):
    """Bytes written by copy ops in this thread (the subscriber's receive thread is not counted)."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if str(func).startswith(COPY_OPS):
            self.bytes += out.numel() * out.element_size()
        return out


@pytest.mark.parametrize(
    "setting, weight_sync, communicator, cuda, expected",
    [
        ("auto", "broadcast", "auto", True, "device"),
        ("auto", "broadcast", "nccl", True, "device"),
        ("auto", "broadcast", "gloo", True, "host"),  # gloo sends from host memory
        ("auto", "filesystem", "auto", True, "host"),  # safetensors files are written from host memory
        ("auto", "broadcast", "auto", False, "host"),  # no GPU: nothing to keep on one
        ("device", "filesystem", "auto", False, "device"),  # an explicit setting is taken as it is
        ("host", "broadcast", "nccl", True, "host"),
    ],
)
def test_auto_publishes_from_the_device_only_where_nccl_may_send(setting, weight_sync, communicator, cuda, expected):
    cfg = build_config(
        {},
        overrides=[
            f"system.weight_sync_publish_from={setting}",
            f"system.weight_sync={weight_sync}",
            f"system.weight_sync_communicator={communicator}",
        ],
    )
    assert publish_from(cfg, cuda=cuda) == expected


@pytest.fixture(scope="module")
def learners(tmp_path_factory):
    from learner.step.trainer import Learner

    model_dir = save_random_qwen2(tmp_path_factory.mktemp("model") / "m")
    out = {}
    for where in ("device", "host"):
        learner = Learner(
            build_config({}, overrides=OVERRIDES + [f"system.weight_sync_publish_from={where}"]), model_dir, pad_id=0
        )
        learner.train_step(trajectories(0, groups=2, group_size=2))
        out[where] = learner
    return out


def _publish_counting(learner) -> tuple[dict, int, dict]:
    """state_dict_for_rollout + a gloo broadcast to one real worker; (state, bytes copied, received)."""
    pub = BroadcastPublisher("127.0.0.1", free_port(), timeout_s=5.0, communicator="gloo", bucket_bytes=BUCKET)
    sub = subscriber(pub, "w0")
    try:
        await_join_request(pub, 1)
        copied = _CopiedBytes()
        with copied:
            state = learner.state_dict_for_rollout()
            pub.publish(1, state)
        assert sub.wait_for(1, 10)
        return state, copied.bytes, dict(sub.fetch(0)[1])
    finally:
        sub.close()
        pub.close()


def _packed_bytes(state) -> int:  # the small tensors the packer copies into its bucket, by design
    return sum(t.numel() * t.element_size() for t in state.values() if t.numel() * t.element_size() <= BUCKET)


def test_publishing_from_the_device_copies_only_the_packed_small_tensors(learners):
    learner = learners["device"]
    params = {p.untyped_storage().data_ptr() for p in learner.engine.module.parameters()}
    state, copied, received = _publish_counting(learner)
    # the state is the parameters' own memory: no copy, not even one
    assert all(t.untyped_storage().data_ptr() in params for t in state.values())
    assert copied == _packed_bytes(state) < sum(t.numel() * t.element_size() for t in state.values()) / 2
    for name, tensor in state.items():
        assert torch.equal(received[name], tensor), name


def test_publishing_from_the_host_copies_every_tensor_once_then_packs(learners):
    learner = learners["host"]
    params = {p.untyped_storage().data_ptr() for p in learner.engine.module.parameters()}
    state, copied, received = _publish_counting(learner)
    total = sum(t.numel() * t.element_size() for t in state.values())
    assert not any(t.untyped_storage().data_ptr() in params for t in state.values())  # a copy the step cannot change
    assert copied == total + _packed_bytes(state)
    for name, tensor in state.items():
        assert torch.equal(received[name], tensor), name


def test_a_background_publish_from_the_device_gets_a_snapshot_the_next_step_does_not_change(learners):
    learner = learners["device"]
    learner.publish_snapshot = True  # as max_staleness >= 1 sets it
    try:
        state = learner.state_dict_for_rollout()
        before = {k: v.clone() for k, v in state.items()}
        learner.train_step(trajectories(1, groups=2, group_size=2))
    finally:
        learner.publish_snapshot = False
    changed = [k for k, v in learner.engine.module.state_dict().items() if not torch.equal(v, before[k])]
    assert changed  # the step did update the model (lr 1e-6 default: tiny but not zero) ...
    assert all(torch.equal(state[k], before[k]) for k in state)  # ... and not the snapshot
