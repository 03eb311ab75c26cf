"""Several optimizer updates per batch (optim.mini_batches, optim.epochs) with the real learner
(DeepSpeed on CPU): one update is the step as it was before mini-batches; four move the ratio off 1,
clip on a batch built to be clipped, and make kl-cov, clip-cov and grpo different updates."""

import dataclasses
import math

import pytest
import torch
from learner_helpers import flat_weights, save_random_qwen2, trajectories

from learner.algorithm.step_plan import StepTokens, mean_entropy, plan_step
from learner.engine import deepspeed_engine as ds
from learner.engine.collectives import all_reduce_sum, gather_step_tokens
from learner.step.forward_passes import prepass, train_pass
from learner.step.ppo_updates import mini_batch_rows
from stare.config import ConfigError, build_config

COMMON = [
    "rollout.prompts_per_step=4",
    "rollout.samples_per_prompt=4",
    "optim.micro_batch=5",
    "optim.lr=1e-3",
    "optim.grad_clip=1000",
    "controller.target=10",
    "optim.zero_stage=0",
    "optim.logits_chunk_tokens=7",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_qwen2(tmp_path_factory.mktemp("model") / "m")


def _learner(model_dir, extra):
    from learner.step.trainer import Learner

    learner = Learner(build_config({}, overrides=COMMON + extra), model_dir, pad_id=0)
    grads = []

    def backward(loss, last):  # the learner's own backward, and the gradients at each update's boundary
        ds.backward(learner.engine, loss * learner.world, last=last)
        if last:
            grads.append(torch.cat([p.grad.reshape(-1).double().clone() for p in learner.engine.module.parameters()]))
        learner.engine.step()

    learner._backward = backward
    return learner, grads


def _before_mini_batches(learner, trajs):
    """The step as the learner ran it before mini-batches (one update; session-6 train_step's
    calls, in its order), on the same learner pieces: loss, metric sums and clip fraction."""
    cfg = learner.cfg
    cut = learner._collate(trajs)
    batch_host, updates = cut.batch, cut.updates
    assert len(updates) == 1
    mbs, batch = updates[0], batch_host.to(learner.device)
    learner.engine.eval()
    old, ent0, dh = prepass(learner.policy, mbs, batch, predicted_entropy_change=True)
    learner.engine.train()
    tokens = gather_step_tokens(StepTokens(old, ent0, batch.advantages, batch.token_uid, batch.mask))
    h_step = mean_entropy(tokens.entropy, tokens.mask, cfg.loss.agg_mode)
    gate = learner.controller.begin_step(float(h_step), float(h_step))
    ctx = plan_step(
        tokens,
        cfg.loss,
        gate=float(gate),
        w=learner.controller.w,
        m=learner.controller.m,
        seed=cfg.run.seed * 1_000_003 + learner.step,
    )
    sums, _ = train_pass(learner.policy, mbs, batch, old, ent0, dh, ctx, cfg.loss, h_step, learner._backward)
    totals = {k: float(all_reduce_sum(v)) for k, v in sums.items()}
    return totals, totals["clipped_tokens"] / float(ctx.norm.num_tokens), float(h_step)


@pytest.mark.parametrize(
    "loss",
    [
        ["loss.name=stare", "loss.variant=C2", "loss.top_fraction=0.3"],
        ["loss.name=clip-cov", "loss.clip_ratio=0.2", "loss.cov_lb=-10", "loss.cov_ub=10"],
    ],
)
def test_one_mini_batch_one_epoch_is_the_step_before_mini_batches(model_dir, loss):
    trajs = trajectories(0, groups=4)
    new, new_grads = _learner(model_dir, loss)
    metrics = new.train_step(trajs)
    ref, ref_grads = _learner(model_dir, loss)
    totals, clip_fraction, entropy = _before_mini_batches(ref, trajs)
    assert metrics["updates"] == 1 and len(new_grads) == len(ref_grads) == 1 and "per_update" not in metrics
    assert metrics["loss"] == pytest.approx(totals["loss"], rel=1e-6, abs=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(clip_fraction, abs=1e-6)
    assert metrics["entropy"] == pytest.approx(entropy, abs=1e-6)
    assert metrics["train_tokens"] == totals["train_tokens"]
    for key in ("omega_sum", "critical_pos_tokens", "critical_neg_tokens", "cov_selected_tokens"):
        if key in totals:
            assert metrics[key] == pytest.approx(totals[key], abs=1e-6), key
    # the first update of a batch is on-policy: the ratio is exactly 1
    assert metrics["ratio_mean"] == 1.0 and metrics["ratio_std"] == 0.0 and metrics["approx_kl"] == 0.0
    assert metrics["clip_fraction_low"] == metrics["clip_fraction_high"] == 0.0
    torch.testing.assert_close(new_grads[0], ref_grads[0], rtol=1e-6, atol=1e-6)
    assert new_grads[0].abs().max() > 0
    torch.testing.assert_close(flat_weights(new), flat_weights(ref), rtol=0, atol=1e-6)


def _crafted():
    """Four groups holding the same four trajectories (rewards 1, 0, 1, 0): each update pushes up the
    responses the next updates train again with A > 0 and pushes down those with A < 0, so from the
    second update on r > 1 where A > 0 and r < 1 where A < 0, far enough at lr 0.05 to clip."""
    base = trajectories(3, groups=1)
    out = []
    for g in range(4):
        for s, t in enumerate(base):
            out.append(dataclasses.replace(t, trajectory_id=f"c{g}-{s}", group_id=f"c{g}", reward=float(s % 2 == 0)))
    return out


def test_four_mini_batches_move_the_ratio_and_clip_both_ways(model_dir):
    learner, grads = _learner(model_dir, ["optim.mini_batches=4", "optim.lr=0.05", "loss.name=grpo"])
    m = learner.train_step(_crafted())
    assert m["updates"] == 4 and len(grads) == 4
    first, later = m["per_update"]["0"], [m["per_update"][str(u)] for u in (1, 2, 3)]
    assert first["ratio_mean"] == 1.0 and first["approx_kl"] == 0.0 and first["clip_fraction"] == 0.0
    for u in later:
        assert u["ratio_std"] > 0.05 and u["approx_kl"] > 0.0
    assert max(u["clip_fraction_high"] for u in later) > 0.0
    assert max(u["clip_fraction_low"] for u in later) > 0.0
    assert m["clip_fraction"] > 0.0
    # per-token means over the updates' tokens, every update trains a quarter of the batch
    tokens = sum(int(t.loss_mask.sum()) for t in _crafted())
    assert m["train_tokens"] == tokens


def test_with_four_mini_batches_kl_cov_clip_cov_and_grpo_are_different_updates(model_dir):
    trajs = trajectories(0, groups=4)
    losses = {
        "grpo": ["loss.name=grpo"],
        "kl-cov": ["loss.name=kl-cov", "loss.kl_ratio=0.2"],
        "clip-cov": ["loss.name=clip-cov", "loss.clip_ratio=0.2", "loss.cov_lb=-10", "loss.cov_ub=10"],
    }
    weights = {}
    for mini in (1, 4):
        for name, extra in losses.items():
            learner, _ = _learner(model_dir, [f"optim.mini_batches={mini}", "optim.lr=0.02"] + extra)
            learner.train_step(trajs)
            weights[name, mini] = flat_weights(learner)
    # one on-policy update: KL-Cov's |log r| has no gradient at r = 1, so it is GRPO to every digit
    torch.testing.assert_close(weights["kl-cov", 1], weights["grpo", 1], rtol=0, atol=0)
    for a, b in (("grpo", "kl-cov"), ("grpo", "clip-cov"), ("kl-cov", "clip-cov")):
        assert (weights[a, 4] - weights[b, 4]).abs().max() > 1e-6, (a, b)


def test_stare_selects_the_top_fraction_of_each_update(model_dir):
    # P = 0.1 inside each update's A > 0 tokens: sum over updates of ceil(0.1 n_u), not ceil(0.1 n)
    trajs = trajectories(0, groups=4)
    learner, _ = _learner(
        model_dir, ["optim.mini_batches=4", "optim.epochs=2", "loss.name=stare", "loss.top_fraction=0.1"]
    )
    m = learner.train_step(trajs)
    assert m["updates"] == 8 and m["epochs"] == 2
    adv_pos = []
    for rows in mini_batch_rows(trajs, 4):
        group = [trajs[i] for i in rows]
        mean = sum(t.reward for t in group) / len(group)
        adv_pos.append(sum(int(t.loss_mask.sum()) for t in group if t.reward > mean))
    assert m["critical_pos_tokens"] == sum(math.ceil(0.1 * n) for n in adv_pos)  # the first epoch's (the batch's)
    assert sum(math.ceil(0.1 * n) for n in adv_pos) != math.ceil(0.1 * sum(adv_pos))  # the test can tell


def test_mini_batches_hold_whole_groups_and_are_bounded_by_the_groups():
    trajs = trajectories(0, groups=5, group_size=2)
    assert mini_batch_rows(trajs, 2) == [[0, 1, 2, 3], [4, 5, 6, 7, 8, 9]]
    assert mini_batch_rows(trajs, 1) == [list(range(10))]
    with pytest.raises(ConfigError, match="optim.mini_batches"):
        build_config({}, overrides=["rollout.prompts_per_step=2", "optim.mini_batches=3"])


@pytest.mark.slow
def test_two_ranks_with_a_mini_batch_empty_on_one_rank_step_together(model_dir, tmp_path):
    # rank 0 has groups 0-1, rank 1 group 2: rank 1's second mini-batch is empty and runs fillers
    from learner_helpers import learner_rank_worker
    from rank_helpers import spawn_ranks

    overrides = COMMON + [
        "rollout.prompts_per_step=3",
        "optim.mini_batches=2",
        "optim.zero_stage=1",
        "loss.name=stare",
        "loss.top_fraction=0.3",
    ]
    spawn_ranks(learner_rank_worker, 2, str(model_dir), str(tmp_path), overrides, timeout_s=300)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert results[0]["metrics"]["updates"] == 2
    assert results[0]["metrics"]["micro_batches"] == results[1]["metrics"]["micro_batches"]
    for key in ("loss", "train_tokens", "critical_pos_tokens", "approx_kl", "clip_fraction_high"):
        assert results[0]["metrics"][key] == results[1]["metrics"][key], key
    assert results[0]["metrics"]["per_update"]["1"]["approx_kl"] > 0.0
    torch.testing.assert_close(results[0]["weights"], results[1]["weights"], rtol=0, atol=0)
