"""Token-budget micro-batches: every row once, under the budget, and the same loss and gradients as
fixed padded micro-batches (the normalisers are step-global)."""

import pytest
import torch
from learner_helpers import random_qwen2, trajectories

from learner.algorithm.step_plan import StepTokens, mean_entropy, plan_step
from learner.step.batch import collate
from learner.step.forward_passes import Policy, hidden_state_fn, prepass, train_pass
from learner.step.micro_batches import build_micro_batch, plan_rows
from stare.config.algo import GrpoLossConfig, StareLossConfig

PROMPTS = [3, 1, 5, 2, 4, 1, 2, 6]
RESPONSES = [10, 2, 30, 1, 7, 7, 3, 12]


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("budget", [8, 20, 40, 1000])
def test_budget_plan_places_every_row_once_under_the_budget(pack, budget):
    groups = plan_rows(PROMPTS, RESPONSES, micro_batch=3, max_tokens=budget, pack=pack)
    assert sorted(r for g in groups for r in g) == list(range(len(PROMPTS)))
    for g in groups:
        total = [PROMPTS[i] + RESPONSES[i] for i in g]
        tokens = sum(total) if pack else len(g) * (max(PROMPTS[i] for i in g) + max(RESPONSES[i] for i in g))
        assert tokens <= budget or len(g) == 1  # a sequence longer than the budget goes alone


def test_without_budget_rows_go_in_order_by_micro_batch():
    assert plan_rows(PROMPTS, RESPONSES, micro_batch=3, max_tokens=None, pack=False) == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_packing_fills_fewer_micro_batches_than_padding():
    packed = plan_rows(PROMPTS, RESPONSES, micro_batch=3, max_tokens=40, pack=True)
    padded = plan_rows(PROMPTS, RESPONSES, micro_batch=3, max_tokens=40, pack=False)
    assert len(packed) < len(padded)


@pytest.mark.parametrize("pack", [False, True])
def test_each_prediction_position_is_followed_by_its_target(pack):
    trajs = trajectories(2)
    batch = collate(trajs, pad_id=0, rows=len(trajs))
    mb = build_micro_batch([5, 0, 9, 2], batch.prompts, batch.responses, pad_id=0, pack=pack)
    flat = mb.input_ids.reshape(-1)
    assert torch.equal(flat[mb.pred_index + 1], mb.targets)
    rows = batch.response_ids[[5, 0, 9, 2], : mb.length].reshape(-1)
    assert torch.equal(rows[mb.token_index], mb.targets)
    sel = [5, 0, 9, 2]
    expected_pos = torch.cat([len(batch.prompts[i]) + torch.arange(len(batch.responses[i])) for i in sel])
    assert torch.equal(mb.position_ids.reshape(-1)[mb.pred_index + 1], expected_pos)  # positions restart per sequence
    if pack:  # rows as wide as the longest sequence, no attention mask, padding only in the rows' tails
        seqs = [len(batch.prompts[i]) + len(batch.responses[i]) for i in sel]
        assert mb.attention_mask is None and mb.input_ids.shape[1] <= max(seqs)
        assert mb.input_ids.shape[0] < len(sel) and mb.model_tokens < len(sel) * max(seqs)


def _step(cfg, cut, seed=3):
    """Loss, gradients of every parameter and the metric sums of one step cut into micro-batches by `cut`."""
    model = random_qwen2(seed=1, dtype=torch.float64)
    trajs = trajectories(seed, groups=4)
    batch = collate(trajs, pad_id=0, rows=len(trajs) + 2)  # two padding rows, as in a real step
    lens = [len(p) for p in batch.prompts], [len(r) for r in batch.responses]
    pack = cut.get("pack", False)
    groups = plan_rows(*lens, micro_batch=cut.get("micro_batch", 4), max_tokens=cut.get("max_tokens"), pack=pack)
    mbs = [build_micro_batch(g, batch.prompts, batch.responses, pad_id=0, pack=pack) for g in groups]
    policy = Policy(
        hidden=hidden_state_fn(model, model, torch.device("cpu")),
        lm_head=model.lm_head,
        device=torch.device("cpu"),
        chunk_tokens=cut.get("chunk", 8),
    )
    model.eval()
    old, ent, dh = prepass(policy, mbs, batch, predicted_entropy_change=True)
    old = old + 0.05 * torch.sin(torch.arange(old.numel(), dtype=old.dtype)).view_as(old)  # off-policy ratios
    tokens = StepTokens(old, ent, batch.advantages, batch.token_uid, batch.mask)
    ctx = plan_step(tokens, cfg, gate=1.0, w=1.4, m=0.6, seed=5)
    h = mean_entropy(ent, batch.mask, cfg.agg_mode)
    sums, quadrants = train_pass(policy, mbs, batch, old, ent, dh, ctx, cfg, h, lambda loss, last: loss.backward())
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return sums, quadrants, grads, len(mbs), (old, ent, dh)


CUTS = [
    dict(micro_batch=1),
    dict(micro_batch=5, chunk=3),
    dict(max_tokens=30, pack=False),
    dict(max_tokens=30, pack=True),
    dict(max_tokens=64, pack=True, chunk=1000),
]


@pytest.mark.parametrize(
    "cfg", [StareLossConfig(variant="C2", top_fraction=0.3), GrpoLossConfig(agg_mode="seq-mean-token-mean")]
)
def test_loss_gradients_and_metrics_do_not_depend_on_the_cut(cfg):
    base_sums, base_q, base_grads, base_n, base_pre = _step(cfg, dict(micro_batch=16))  # one padded micro-batch
    assert base_n == 1
    for cut in CUTS:
        sums, q, grads, n, pre = _step(cfg, cut)
        assert n > 1, cut
        for a, b in zip(pre, base_pre):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
        for k in base_sums:
            torch.testing.assert_close(sums[k], base_sums[k], rtol=1e-10, atol=1e-12, msg=f"{cut} {k}")
        torch.testing.assert_close(q, base_q, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(grads, base_grads, rtol=1e-9, atol=1e-12)
