"""Tied weights (the tiny model ties `lm_head.weight` to `model.embed_tokens.weight`, as Qwen2.5-1.5B
does) travel once in the weight broadcast, and the receiver gets every name back, the two names one
tensor again. Bytes are counted where the publisher hands each message to the group's `send` (real
gloo broadcast to a real worker, on CPU), not derived from the layout alone."""

import json

import pytest
import torch
from broadcast_helpers import await_join_request, subscriber

from stare.config import build_config
from stare.runtime.net import free_port
from stare.weight_sync import broadcast
from stare.weight_sync.broadcast import BroadcastPublisher
from stare.weight_sync.buckets import BucketPacker, Segments

OVERRIDES = [
    "rollout.prompts_per_step=2",
    "rollout.samples_per_prompt=2",
    "optim.micro_batch=4",
    "optim.zero_stage=1",
    "system.max_staleness=0",
]
TIED = ("lm_head.weight", "model.embed_tokens.weight")
BUCKET = 4096  # bytes: the embedding (vocab x hidden fp32) is larger, sent from its own memory in chunks


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def test_the_tiny_model_ties_its_embeddings(tiny_model_dir):
    assert json.loads((tiny_model_dir / "config.json").read_text())["tie_word_embeddings"] is True


@pytest.fixture(scope="module")
def learners(tiny_model_dir):
    from learner.step.trainer import Learner

    return {
        where: Learner(
            build_config({}, overrides=OVERRIDES + [f"system.weight_sync_publish_from={where}"]),
            tiny_model_dir,
            pad_id=0,
        )
        for where in ("device", "host")
    }


def _publish_counting_sent_bytes(state, monkeypatch) -> tuple[int, dict]:
    """Publish `state` to one worker over gloo; (bytes handed to send, the worker's state)."""
    sent = []
    original = broadcast._send_all

    def counting(pg, messages, ranks, lost):
        def counted():
            for msg in messages:
                sent.append(msg.payload.numel())  # uint8: bytes
                yield msg

        return original(pg, counted(), ranks, lost)

    monkeypatch.setattr(broadcast, "_send_all", counting)
    pub = BroadcastPublisher("127.0.0.1", free_port(), timeout_s=5.0, communicator="gloo", bucket_bytes=BUCKET)
    sub = subscriber(pub, "w0")
    try:
        await_join_request(pub, 1)
        pub.publish(1, state)
        assert sub.wait_for(1, 10)
        return sum(sent), dict(sub.fetch(0)[1])
    finally:
        sub.close()
        pub.close()


@pytest.mark.parametrize("where", ["device", "host"])
def test_tied_weights_are_sent_once_and_received_under_both_names(learners, tiny_model_dir, where, monkeypatch):
    from transformers import AutoModelForCausalLM

    learner = learners[where]
    state = learner.state_dict_for_rollout()
    tied = _nbytes(state[TIED[1]])
    assert tied > BUCKET  # 38 x 64 fp32: 9728 bytes, a segment of its own
    untied = {k: v.clone() for k, v in state.items()}  # the same weights, every name its own memory
    sent_untied, _ = _publish_counting_sent_bytes(untied, monkeypatch)
    sent, received = _publish_counting_sent_bytes(state, monkeypatch)
    # the embedding's second name was a segment of its own, so dropping it changes no packed bucket
    assert sent == sent_untied - tied
    assert list(received) == list(state)
    for name, tensor in state.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), name
    # the alias is restored: one tensor under both names, as in the model's own state dict
    assert received[TIED[0]].data_ptr() == received[TIED[1]].data_ptr()
    # every name an engine loads: the HF model's whole state dict, strictly
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.load_state_dict(received, strict=True)
    own = learner.engine.module.state_dict()
    assert all(torch.equal(v, own[k]) for k, v in model.state_dict().items())


def test_a_tied_packed_tensor_is_copied_once_and_a_tied_large_one_sent_once():
    """The packer on its own: a small tied pair (packed in a bucket) and a large one (its own
    segment); the receiver's views of each pair are one memory."""
    g = torch.Generator().manual_seed(0)
    small, large = torch.randn(4, generator=g), torch.randn(300, generator=g)  # 16 and 1200 bytes
    state = {"a": small, "big": large, "b": torch.randn(3, generator=g), "a_tied": small, "big_tied": large}
    packer = BucketPacker(256, torch.device("cpu"))
    layout = packer.layout(state)
    # packed: a at 0 (16 B), then big closes the bucket; b and a new bucket; big_tied and a_tied nowhere new
    assert layout.segments == [16, 1200, 12]
    buffers = Segments(torch.device("cpu"))
    sent = 0
    # each message copied as it comes (the packer's two buckets alternate), as a receive would take it
    for target, msg in zip(buffers.targets(layout), packer.messages(state, layout), strict=True):
        target.copy_(msg.payload)
        sent += msg.payload.numel()
    assert sent == 16 + 1200 + 12
    out = buffers.tensors(layout)
    assert all(torch.equal(out[k], v) for k, v in state.items())
    assert out["a"].data_ptr() == out["a_tied"].data_ptr() and out["big"].data_ptr() == out["big_tied"].data_ptr()


def test_lora_merged_weights_keep_the_tie(tiny_model_dir):
    """With LoRA (adapters on the projections, not the embedding) the merged state holds the tied
    embedding once under both names, so its broadcast sends it once too."""
    from transformers import AutoModelForCausalLM

    from learner.engine.lora import merged_state_dict, wrap

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    embed = base.state_dict()[TIED[1]].clone()
    model = wrap(base, build_config({}, overrides=["model.lora.r=4", "model.lora.alpha=8"]).model.lora)
    merged = merged_state_dict(model)
    assert merged[TIED[0]] is merged[TIED[1]] and torch.equal(merged[TIED[1]], embed)
    assert set(merged) == set(AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict())
