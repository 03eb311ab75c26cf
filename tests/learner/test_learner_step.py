"""The real learner (DeepSpeed on CPU): one step's metrics and weights do not depend on how the step
is cut into micro-batches, packed or not, nor on gradient checkpointing or the logits chunk."""

import pytest
import torch
from learner_helpers import learner_rank_worker, save_random_qwen2, trajectories
from rank_helpers import spawn_ranks

from learner.engine import deepspeed_engine as ds
from stare.config import build_config

COMMON = [
    "rollout.prompts_per_step=3",
    "rollout.samples_per_prompt=4",
    "optim.micro_batch=12",
    "optim.lr=1e-3",
    "optim.grad_clip=1000",
    "diagnostics.predicted_entropy_change=true",
    "controller.target=10",
]
COMPARED = (
    "loss",
    "entropy",
    "grad_norm",
    "clip_fraction",
    "omega_sum",
    "rollout_logprob_gap",
    "quadrant/pos_high/fraction",
    "quadrant/neg_low/predicted_dH",
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_qwen2(tmp_path_factory.mktemp("model") / "m")


def _one_step(model_dir, extra):
    from learner.step.trainer import Learner

    learner = Learner(build_config({}, overrides=COMMON + extra), model_dir, pad_id=0)
    metrics = learner.train_step(trajectories(0))
    weights = torch.cat([p.detach().reshape(-1).double() for p in learner.engine.module.parameters()])
    return metrics, weights


def test_micro_batch_cut_checkpointing_and_chunking_leave_the_step_unchanged(model_dir):
    base, base_w = _one_step(model_dir, [])  # one padded micro-batch of 12 rows, whole-chunk logits
    assert base["micro_batches"] == 1 and base["gate"] == 1
    for extra in (
        ["optim.micro_batch=5", "optim.logits_chunk_tokens=3"],
        ["optim.max_tokens_per_micro_batch=40"],
        ["optim.max_tokens_per_micro_batch=40", "optim.pack_sequences=false", "optim.gradient_checkpointing=true"],
    ):
        metrics, weights = _one_step(model_dir, extra)
        assert metrics["micro_batches"] > 1, extra
        for key in COMPARED:
            assert metrics[key] == pytest.approx(base[key], rel=1e-5, abs=1e-6), (extra, key)
        torch.testing.assert_close(weights, base_w, rtol=0, atol=1e-6)
        assert not torch.equal(weights, _initial_weights(model_dir))  # the step did move the weights


def _initial_weights(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


def test_packing_computes_fewer_model_tokens(model_dir):
    padded, _ = _one_step(model_dir, [])
    packed, _ = _one_step(model_dir, ["optim.max_tokens_per_micro_batch=40"])
    trajs = trajectories(0)
    real = sum(len(t.prompt_token_ids) + len(t.response_token_ids) for t in trajs)
    assert real <= packed["model_tokens"] < padded["model_tokens"]


def test_fused_adam_only_when_asked():
    kw = dict(
        micro_batch=1,
        grad_accum=1,
        world_size=1,
        lr=1e-3,
        betas=(0.9, 0.99),
        weight_decay=0.0,
        grad_clip=1.0,
        zero_stage=1,
    )
    assert ds.deepspeed_config(**kw, fused_adam=True)["optimizer"]["params"]["fused"] is True
    assert "fused" not in ds.deepspeed_config(**kw)["optimizer"]["params"]


def test_two_learner_ranks_give_the_one_rank_step(model_dir, tmp_path):
    # Unequal shares (8 and 4 rows) under a token budget: the ranks have different micro-batch
    # counts and response widths, so fillers, the common width and global uids all take part.
    extra = [
        "optim.max_tokens_per_micro_batch=24",
        "loss.name=clip-cov",
        "loss.clip_ratio=0.2",
        "loss.cov_lb=-10",
        "loss.cov_ub=10",
    ]
    from learner.step.micro_batches import plan_rows

    trajs = trajectories(0)
    counts = [
        len(
            plan_rows(
                [len(t.prompt_token_ids) for t in share],
                [len(t.response_token_ids) for t in share],
                micro_batch=12,
                max_tokens=24,
                pack=True,
            )
        )
        for share in (trajs[:8], trajs[8:])
    ]
    widths = [max(len(t.response_token_ids) for t in share) for share in (trajs[:8], trajs[8:])]
    assert counts[0] != counts[1] and widths[0] != widths[1]  # fillers and the common width take part
    one, one_w = _one_step(model_dir, extra)
    spawn_ranks(learner_rank_worker, 2, str(model_dir), str(tmp_path), COMMON + extra, timeout_s=300)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert results[0]["metrics"]["micro_batches"] == results[1]["metrics"]["micro_batches"]
    for res in results:
        for key in COMPARED[:4] + ("train_tokens", "quadrant/pos_high/fraction", "quadrant/neg_low/predicted_dH"):
            assert res["metrics"][key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key
        torch.testing.assert_close(res["weights"], one_w, rtol=0, atol=1e-6)
