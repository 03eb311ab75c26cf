"""A 2-process gloo data-parallel group gives the same selection, loss and gradients as one process."""

import pytest
import torch
from algo_helpers import dp_worker, inputs, loss_and_grad, random_step
from rank_helpers import spawn_ranks

from learner.algorithm.losses import policy_loss
from stare.config.algo import ClipCovLossConfig, StareLossConfig


def _run_dp(cfg, step, tmp_path, world=2):
    spawn_ranks(dp_worker, world, cfg, step, str(tmp_path))
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


@pytest.mark.parametrize(
    "cfg",
    [
        StareLossConfig(variant="C2", top_fraction=0.2),
        StareLossConfig(variant="C2", agg_mode="seq-mean-token-mean"),
        ClipCovLossConfig(clip_ratio=0.05, cov_lb=0.1),
    ],
)
def test_two_rank_gloo_group_matches_one_process(cfg, tmp_path):
    step = random_step(11, rows=8, length=10)
    results = _run_dp(cfg, step, tmp_path)

    loss, grad, ctx = loss_and_grad(step, cfg, gate=1.0, w=1.3, m=0.7, seed=2)
    shift = torch.zeros((), dtype=torch.float64, requires_grad=True)
    policy_loss(inputs(step, logp=step["logp"] + shift), ctx, cfg).loss.backward()

    for rank, res in enumerate(results):
        torch.testing.assert_close(res["grad"], grad[rank::2], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(res["loss"], loss, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(res["shared"], shift.grad, rtol=1e-12, atol=1e-14)
