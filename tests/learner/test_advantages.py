import math

import torch

from learner.algorithm.advantages import broadcast_to_tokens, grpo_advantages


def test_group_normalised_with_unbiased_std():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    adv = grpo_advantages(rewards, torch.zeros(4, dtype=torch.long), 1, eps=0.0)
    # mean 0.5; unbiased std = sqrt(4 * 0.25 / 3) = sqrt(1/3); A = +-0.5 * sqrt(3)
    a = 0.5 * math.sqrt(3)
    torch.testing.assert_close(adv, torch.tensor([a, -a, a, -a], dtype=torch.float64), rtol=0, atol=1e-12)


def test_without_std_is_reward_minus_group_mean():
    rewards = torch.tensor([3.0, 1.0, 2.0, 5.0, 7.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1])
    adv = grpo_advantages(rewards, groups, 2, scale_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, 0.0, -1.0, 1.0], dtype=torch.float64), rtol=0, atol=0)


def test_zero_variance_group_gets_exactly_zero_even_when_mean_rounds():
    # 0.1 * 3 / 3 != 0.1 in float; a naive (r - mean) / (std + eps) would be ~1e-17 / 1e-6.
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0], dtype=torch.float32)
    adv = grpo_advantages(rewards, torch.tensor([0, 0, 0, 1, 1]), 2)
    assert torch.equal(adv[:3], torch.zeros(3))
    assert adv[3] > 0 > adv[4]


def test_group_of_one_gets_zero():
    adv = grpo_advantages(torch.tensor([0.7, 1.0, 0.0]), torch.tensor([0, 1, 1]), 2)
    assert adv[0] == 0


def test_uneven_groups_match_independent_computation():
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(11, generator=g, dtype=torch.float64)
    groups = torch.tensor([2, 0, 1, 2, 0, 0, 1, 2, 2, 0, 1])
    adv = grpo_advantages(rewards, groups, 3, eps=1e-6)
    for gid in range(3):
        r = rewards[groups == gid]
        expected = (r - r.mean()) / (r.std() + 1e-6)
        torch.testing.assert_close(adv[groups == gid], expected, rtol=1e-12, atol=1e-12)


def test_broadcast_puts_sequence_advantage_on_response_tokens_only():
    mask = torch.tensor([[True, True, False], [True, False, False]])
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask)
    assert torch.equal(out, torch.tensor([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]))
