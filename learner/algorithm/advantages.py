"""GRPO group-normalised outcome advantages.

Pure tensor functions; no host synchronisation. Group ids must be dense (0..num_groups-1): the
batch assembler knows them, so we never call `unique` on the hot path.
"""

from __future__ import annotations

import torch
from torch import Tensor


def grpo_advantages(
    rewards: Tensor,  # [N] float, one reward per trajectory
    group_index: Tensor,  # [N] long in [0, num_groups)
    num_groups: int,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:  # [N]
    """A_i = (r_i - mean_g) / (std_g + eps), std unbiased (torch.std); without scaling, r_i - mean_g.

    A group whose rewards are all equal (including a group of one) gets exactly zero advantage,
    whatever the rounding of its mean.
    """
    dtype = rewards.dtype
    zeros = torch.zeros(num_groups, dtype=dtype, device=rewards.device)  # [G]
    count = zeros.index_add(0, group_index, torch.ones_like(rewards))  # [G]
    mean = zeros.index_add(0, group_index, rewards) / count.clamp(min=1)  # [G]
    centered = rewards - mean[group_index]  # [N]
    group_max = torch.full_like(zeros, -torch.inf).scatter_reduce(0, group_index, rewards, "amax")  # [G]
    group_min = torch.full_like(zeros, torch.inf).scatter_reduce(0, group_index, rewards, "amin")  # [G]
    constant = (group_max == group_min)[group_index]  # [N]
    if scale_by_std:
        sq = zeros.index_add(0, group_index, centered * centered)  # [G]
        std = torch.sqrt(sq / (count - 1).clamp(min=1))  # [G]
        centered = centered / (std[group_index] + eps)
    return torch.where(constant, torch.zeros_like(centered), centered)


def broadcast_to_tokens(
    advantages: Tensor,  # [B]
    mask: Tensor,  # [B, L] bool
) -> Tensor:  # [B, L]
    """Sequence advantage on every response token; zero on padding."""
    return advantages[:, None] * mask.to(advantages.dtype)
