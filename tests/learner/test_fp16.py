"""model.dtype float16: fp16 weights, fp32 optimizer state and DeepSpeed's dynamic loss scaling.

DeepSpeed refuses fp16 on a CPU without native fp16 kernels (this machine): the learner says so,
naming the field. The other tests lift only that capability check (`fp16_capable`); DeepSpeed's fp16
optimizer, its loss scaler and our step then run for real on CPU, as they would on a GPU."""

import pytest
import torch
from learner_helpers import flat_weights, save_random_qwen2, trajectories

from stare.config import ConfigError, build_config

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


@pytest.fixture
def fp16_capable(monkeypatch):
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(type(get_accelerator()), "is_fp16_supported", lambda self: True)


def _learner(model_dir, dtype):
    from learner.step.trainer import Learner

    return Learner(build_config({}, overrides=COMMON + [f"model.dtype={dtype}"]), model_dir, pad_id=0)


def test_fp16_is_refused_naming_the_field_where_the_device_has_no_fp16(model_dir):
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().is_fp16_supported():
        pytest.skip("this device computes in fp16")
    with pytest.raises(ConfigError, match="model.dtype: float16"):
        _learner(model_dir, "float16")


def test_an_fp16_step_trains_fp16_weights_with_loss_scaling_close_to_fp32(model_dir, fp16_capable):
    ref = _learner(model_dir, "float32").train_step(trajectories(0))
    learner = _learner(model_dir, "float16")
    before = flat_weights(learner, torch.float32)
    got = learner.train_step(trajectories(0))
    assert next(learner.engine.module.parameters()).dtype == torch.float16
    assert got["loss_scale"] == 2.0**16 and got["skipped_steps"] == 0
    assert got["loss"] == pytest.approx(ref["loss"], rel=2e-2, abs=2e-3)  # fp16 logits, fp32 loss
    assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=2e-2)  # unscaled before it is reported
    assert not torch.equal(flat_weights(learner, torch.float32), before)


def test_an_overflowing_fp16_step_is_skipped_and_counted(model_dir, fp16_capable):
    learner = _learner(model_dir, "float16")
    learner.engine.optimizer.cur_scale = 2.0**40  # every scaled fp16 gradient overflows
    before = flat_weights(learner, torch.float32)
    got = learner.train_step(trajectories(0))
    assert got["skipped_steps"] == 1
    torch.testing.assert_close(flat_weights(learner, torch.float32), before, rtol=0, atol=0)  # no update applied
    got = learner.train_step(trajectories(1))  # the scaler backs off (hysteresis 2): skipped again, then lowered
    assert got["skipped_steps"] == 2 and got["loss_scale"] < 2.0**40
