"""Scored trajectories -> padded training tensors for one optimizer step.

Layout: prompts are left-padded and responses right-padded, so every response starts at column
`prompt_width` of `input_ids` and the logits that predict response token j sit at column
`prompt_width - 1 + j`. Rows beyond the real trajectories (the step is padded to a fixed number
of rows so gradient accumulation has a fixed length) have an all-False mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from stare.learner.advantages import broadcast_to_tokens, grpo_advantages
from stare.records import Trajectory

UID_STRIDE = 1 << 20  # token uid = row index in the step x UID_STRIDE + position


@dataclass(frozen=True)
class TrainBatch:
    input_ids: Tensor  # [S, P + L] long
    attention_mask: Tensor  # [S, P + L] long
    position_ids: Tensor  # [S, P + L] long
    prompt_width: int  # P
    response_ids: Tensor  # [S, L] long
    mask: Tensor  # [S, L] bool, tokens that train (loss_mask of real tokens)
    rollout_logprobs: Tensor  # [S, L] float32
    advantages: Tensor  # [S, L]
    token_uid: Tensor  # [S, L] int64
    rewards: Tensor  # [S] (0 on padding rows)
    real_rows: int  # rows that hold trajectories
    lengths: tuple[int, ...]  # response length of each row (host ints, for trimming)

    def rows(self, sl: slice) -> "TrainBatch":
        """A micro-batch, trimmed to its longest response."""
        length = max(self.lengths[sl])
        keep = self.prompt_width + length
        return TrainBatch(
            input_ids=self.input_ids[sl, :keep], attention_mask=self.attention_mask[sl, :keep],
            position_ids=self.position_ids[sl, :keep], prompt_width=self.prompt_width,
            response_ids=self.response_ids[sl, :length], mask=self.mask[sl, :length],
            rollout_logprobs=self.rollout_logprobs[sl, :length], advantages=self.advantages[sl, :length],
            token_uid=self.token_uid[sl, :length], rewards=self.rewards[sl], real_rows=self.real_rows,
            lengths=self.lengths[sl],
        )


def collate(
    trajectories: list[Trajectory],
    *,
    pad_id: int,
    rows: int,
    scale_by_std: bool = True,
) -> TrainBatch:
    """Pad `trajectories` (whole groups, rewards set) into a TrainBatch of exactly `rows` rows."""
    if len(trajectories) > rows:
        raise ValueError(f"{len(trajectories)} trajectories do not fit a step of {rows} rows")
    group_ids = {g: i for i, g in enumerate(dict.fromkeys(t.group_id for t in trajectories))}
    rewards = torch.tensor([float(t.reward) for t in trajectories], dtype=torch.float32)  # [N]
    groups = torch.tensor([group_ids[t.group_id] for t in trajectories], dtype=torch.long)  # [N]
    adv = grpo_advantages(rewards, groups, len(group_ids), scale_by_std=scale_by_std)  # [N]

    P = max(len(t.prompt_token_ids) for t in trajectories)
    L = max(len(t.response_token_ids) for t in trajectories)
    input_ids = np.full((rows, P + L), pad_id, dtype=np.int64)
    attention = np.zeros((rows, P + L), dtype=np.int64)
    mask = np.zeros((rows, L), dtype=bool)
    rollout_lp = np.zeros((rows, L), dtype=np.float32)
    for i, t in enumerate(trajectories):
        p, r = len(t.prompt_token_ids), len(t.response_token_ids)
        input_ids[i, P - p : P] = t.prompt_token_ids
        input_ids[i, P : P + r] = t.response_token_ids
        attention[i, P - p : P + r] = 1
        mask[i, :r] = t.loss_mask.astype(bool)
        rollout_lp[i, :r] = t.response_logprobs
    for i in range(len(trajectories), rows):  # padding rows: a one-token dummy, never trained
        attention[i, P] = 1
    attention_t = torch.from_numpy(attention)
    position_ids = (attention_t.cumsum(-1) - 1).clamp(min=0)
    mask_t = torch.from_numpy(mask)
    seq_adv = torch.zeros(rows)
    seq_adv[: len(trajectories)] = adv
    seq_rewards = torch.zeros(rows)
    seq_rewards[: len(trajectories)] = rewards
    uid = torch.arange(rows)[:, None] * UID_STRIDE + torch.arange(L)[None, :]
    ids = torch.from_numpy(input_ids)
    return TrainBatch(
        input_ids=ids, attention_mask=attention_t, position_ids=position_ids, prompt_width=P,
        response_ids=ids[:, P:], mask=mask_t, rollout_logprobs=torch.from_numpy(rollout_lp),
        advantages=broadcast_to_tokens(seq_adv, mask_t), token_uid=uid, rewards=seq_rewards,
        real_rows=len(trajectories),
        lengths=tuple(len(t.response_token_ids) for t in trajectories) + (1,) * (rows - len(trajectories)),
    )


def token_logprobs_and_entropy(
    logits: Tensor,  # [B, P + L, V]
    batch: TrainBatch,
) -> tuple[Tensor, Tensor]:  # logprobs [B, L], entropy [B, L]
    """log pi(response token) and the entropy of each response position's distribution (fp32)."""
    L = batch.response_ids.shape[1]
    P = batch.prompt_width
    resp_logits = logits[:, P - 1 : P - 1 + L].float()  # [B, L, V]
    logp_full = torch.log_softmax(resp_logits, -1)  # [B, L, V]
    logprobs = logp_full.gather(-1, batch.response_ids[..., None]).squeeze(-1)  # [B, L]
    entropy = -(logp_full.exp() * logp_full).sum(-1)  # [B, L]
    return logprobs, entropy
