"""The frozen reference of `loss.ref_kl` in the real learner (DeepSpeed on CPU, fp32): coef 0 leaves the step
unchanged, the reference never moves while the policy does, a resumed learner reads the same reference (and
refuses a different base folder), the pre-pass ahead of a step keeps its values, and two gloo ranks (ZeRO-1 and
ZeRO-3, the reference sharded) give the one-rank steps."""

import shutil

import pytest
import torch
from learner_helpers import leader_follower_worker, save_random_qwen2, trajectories
from rank_helpers import spawn_ranks

from learner.engine.checkpoints import CheckpointError
from stare.config import build_config

COMMON = [
    "rollout.prompts_per_step=3",
    "rollout.samples_per_prompt=4",
    "optim.micro_batch=5",
    "optim.lr=1e-2",
    "optim.grad_clip=1000",
    "controller.target=10",
    "optim.logits_chunk_tokens=4",
]
REF = ["loss.ref_kl.coef=0.5", "loss.entropy_coef=0.01"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_qwen2(tmp_path_factory.mktemp("model") / "m")


def _learner(model_dir, extra=()):
    from learner.step.trainer import Learner

    return Learner(build_config({}, overrides=COMMON + list(extra)), model_dir, pad_id=0)


def _flat(module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double() for p in module.parameters()])


def _base(model_dir) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    return _flat(AutoModelForCausalLM.from_pretrained(model_dir))


def test_coef_zero_leaves_the_step_unchanged_and_measures_a_zero_kl(model_dir):
    plain = _learner(model_dir)
    plain_metrics = plain.train_step(trajectories(0))
    watched = _learner(model_dir, ["loss.ref_kl.coef=0"])
    metrics = watched.train_step(trajectories(0))
    torch.testing.assert_close(_flat(watched.engine.module), _flat(plain.engine.module), rtol=0, atol=1e-6)
    assert metrics["loss"] == pytest.approx(plain_metrics["loss"], abs=1e-6)
    # the first step's policy is the reference: its KL is 0 (two code paths: the training forward's chunks
    # with grad, the reference's without)
    assert "ref_kl" not in plain_metrics and abs(metrics["ref_kl"]) < 1e-6
    assert not torch.equal(_flat(watched.engine.module), _base(model_dir))  # the step did move the policy


def test_the_reference_stays_the_base_model_while_the_policy_moves(model_dir):
    learner = _learner(model_dir, REF)
    first = learner.train_step(trajectories(0))
    second = learner.train_step(trajectories(1))
    base = _base(model_dir)
    assert torch.equal(_flat(learner.reference.module), base)  # frozen: bit for bit the base folder's weights
    assert all(not p.requires_grad for p in learner.reference.module.parameters())
    assert not torch.equal(_flat(learner.engine.module), base)
    assert abs(first["ref_kl"]) < 1e-6 < second["ref_kl"]  # the policy moved away from it
    assert second["ref_kl_loss"] > 0 and first["entropy_bonus"] > 0


def test_a_resumed_learner_reads_the_same_reference(model_dir, tmp_path):
    straight = _learner(model_dir, REF)
    want = [straight.train_step(trajectories(i)) for i in range(2)]
    first = _learner(model_dir, REF)
    first.train_step(trajectories(0))
    first.save(tmp_path / "ckpt", {})
    resumed = _learner(model_dir, REF)
    resumed.load(tmp_path / "ckpt")
    got = resumed.train_step(trajectories(1))
    for key in ("ref_kl", "ref_kl_loss", "loss", "entropy"):
        assert got[key] == pytest.approx(want[1][key], rel=1e-5, abs=1e-7), key
    torch.testing.assert_close(_flat(resumed.engine.module), _flat(straight.engine.module), rtol=0, atol=1e-6)
    assert torch.equal(_flat(resumed.reference.module), _base(model_dir))


def test_a_resume_on_another_base_model_is_refused(model_dir, tmp_path):
    learner = _learner(model_dir, REF)
    learner.train_step(trajectories(0))
    learner.save(tmp_path / "ckpt", {})
    other = save_random_qwen2(tmp_path / "other", seed=1)
    with pytest.raises(CheckpointError, match="reference model .* differs"):
        _learner(other, REF).load(tmp_path / "ckpt")
    same = tmp_path / "copy"
    shutil.copytree(model_dir, same)  # the same files elsewhere (a moved run): accepted
    _learner(same, REF).load(tmp_path / "ckpt")


def test_prepared_rows_keep_the_reference_values(model_dir):
    unprepared = _learner(model_dir, REF + ["diagnostics.predicted_entropy_change=true"])
    want = unprepared.train_step(trajectories(0))
    learner, trajs = _learner(model_dir, REF + ["diagnostics.predicted_entropy_change=true"]), trajectories(0)
    learner.prepare(trajs[4:])  # groups 1 and 2 ahead; group 0 at step time
    got = learner.train_step(trajs)
    assert got["prepared_rows"] == 8
    for key in ("ref_kl", "ref_kl_loss", "loss", "quadrant/neg_low/predicted_dH"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
    torch.testing.assert_close(_flat(learner.engine.module), _flat(unprepared.engine.module), rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("zero_stage", [1, 3])
def test_two_ranks_give_the_one_rank_steps(model_dir, tmp_path, zero_stage):
    extra = REF + [f"optim.zero_stage={zero_stage}", "optim.max_tokens_per_micro_batch=24"]
    steps = [3, 1]  # step 2: rank 0 has no group and runs fillers only (the reference's gathers too)
    one = _learner(model_dir, extra)
    sharded = [hasattr(p, "ds_id") for p in one.reference.module.parameters()]
    assert all(sharded) if zero_stage == 3 else not any(sharded)  # ZeRO-3: partitioned like the policy
    want = [one.train_step(trajectories(i)[: g * 4]) for i, g in enumerate(steps)]
    spawn_ranks(leader_follower_worker, 2, str(model_dir), str(tmp_path), COMMON + extra, steps, timeout_s=300)
    got = torch.load(tmp_path / "leader.pt")
    for i, (mine, ref) in enumerate(zip(got["metrics"], want, strict=True)):
        for key in ("ref_kl", "ref_kl_loss", "entropy_bonus", "loss", "grad_norm", "train_tokens"):
            assert mine[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6), (i, key)
    assert want[1]["ref_kl"] > 0


def test_with_lora_the_reference_is_the_policy_with_its_adapters_off(model_dir):
    pytest.importorskip("peft")
    extra = REF + ["model.lora.r=4", "model.lora.target_modules=[q_proj,v_proj]", "optim.lr=5e-2"]
    learner = _learner(model_dir, extra)
    assert learner.reference.module is None  # no second copy
    first = learner.train_step(trajectories(0))
    second = learner.train_step(trajectories(1))
    assert abs(first["ref_kl"]) < 1e-6 < second["ref_kl"]  # B starts at 0: the adapters change nothing at first
