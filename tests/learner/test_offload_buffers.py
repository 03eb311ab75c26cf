"""The optimizer state aside while a colocated engine samples (system.colocate_offload: optimizer): its host
buffers are made once and reused at every wake, and the state comes back exactly.

On a CPU DeepSpeed's pinned-buffer path runs with unpinned memory (its CPU accelerator's pin is a no-op), so
the buffer bookkeeping is the GPU's; only the page-locking is not exercised here."""

import pytest
import torch
from learner_helpers import flat_weights, save_random_qwen2, trajectories

from learner.engine import deepspeed_engine as ds
from stare.config import build_config

COMMON = [
    "rollout.prompts_per_step=3",
    "rollout.samples_per_prompt=4",
    "optim.micro_batch=12",
    "optim.lr=1e-3",
    "optim.grad_clip=1000",
    "controller.target=10",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_qwen2(tmp_path_factory.mktemp("model") / "m")


def _learner(model_dir, stage: int):
    from learner.step.trainer import Learner

    return Learner(build_config({}, overrides=COMMON + [f"optim.zero_stage={stage}"]), model_dir, pad_id=0)


def _addresses(learner) -> dict:
    """Every host buffer an offload uses: ours (the Adam moments) and DeepSpeed's fp32 master copies."""
    engine = learner.engine
    out = {("stash",) + k: b.data_ptr() for k, b in engine._stare_stash.buffers.items()}
    for i, b in enumerate(getattr(engine.optimizer, "hp_params_pin_buffers", [])):
        out[("hp_params", i)] = b.data_ptr()
    return out


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_every_wake_reuses_the_host_buffers_the_first_offload_made(model_dir, stage):
    learner = _learner(model_dir, stage)
    learner.train_step(trajectories(0))  # the Adam moments exist from the first step on
    ds.offload_optimizer_states(learner.engine)
    first = _addresses(learner)
    assert any(k[0] == "stash" for k in first)
    assert (stage == 0) != any(k[0] == "hp_params" for k in first)  # ZeRO-1/2: DeepSpeed's master copies too
    for step in (1, 2):
        ds.reload_optimizer_states(learner.engine)
        learner.train_step(trajectories(step))
        ds.offload_optimizer_states(learner.engine)
        assert _addresses(learner) == first  # no buffer made (pinned, on a GPU) again
    ds.reload_optimizer_states(learner.engine)


@pytest.mark.parametrize("stage", [0, 1])
def test_steps_between_offloads_equal_steps_without_them(model_dir, stage):
    plain, cycled = _learner(model_dir, stage), _learner(model_dir, stage)
    for step in range(3):
        plain.train_step(trajectories(step))
        cycled.train_step(trajectories(step))
        ds.offload_optimizer_states(cycled.engine)
        assert "optim_states" in ds.offloaded_states(cycled.engine)
        ds.reload_optimizer_states(cycled.engine)
        assert "optim_states" not in ds.offloaded_states(cycled.engine)
    assert torch.equal(flat_weights(plain, None), flat_weights(cycled, None))
