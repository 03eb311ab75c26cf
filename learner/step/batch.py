"""Scored trajectories -> padded training tensors for one optimizer step.

Layout: prompts are left-padded and responses right-padded, so every response starts at column
`prompt_width` of `input_ids` and the logits that predict response token j sit at column
`prompt_width - 1 + j`. Rows beyond the real trajectories (the step is padded to a fixed number
of rows so gradient accumulation has a fixed length) have an all-False mask.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from learner.algorithm.advantages import broadcast_to_tokens, grpo_advantages
from stare.transport.records import Trajectory

UID_STRIDE = 1 << 20  # token uid = global row index x UID_STRIDE + position (L < 2^20)


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
    prompts: tuple[np.ndarray, ...] = ()  # prompt token ids of each real row (host, for micro-batches)
    responses: tuple[np.ndarray, ...] = ()  # response token ids of each real row
    is_weight: Tensor | None = None  # [S, L] rollout-correction IS weight, detached (None: none; set by the learner)

    def to(self, device: torch.device) -> TrainBatch:
        """The step-level tensors on `device` (pinned, non-blocking on CUDA); host fields kept."""
        cuda = torch.device(device).type == "cuda"
        move = lambda t: (t.pin_memory() if cuda else t).to(device, non_blocking=cuda)  # noqa: E731
        return dataclasses.replace(
            self,
            **{
                f.name: move(getattr(self, f.name))
                for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), Tensor)
            },
        )

    def rows(self, sl: slice) -> TrainBatch:
        """A micro-batch, trimmed to its longest response."""
        length = max(self.lengths[sl])
        keep = self.prompt_width + length
        return TrainBatch(
            input_ids=self.input_ids[sl, :keep],
            attention_mask=self.attention_mask[sl, :keep],
            position_ids=self.position_ids[sl, :keep],
            prompt_width=self.prompt_width,
            response_ids=self.response_ids[sl, :length],
            mask=self.mask[sl, :length],
            rollout_logprobs=self.rollout_logprobs[sl, :length],
            advantages=self.advantages[sl, :length],
            token_uid=self.token_uid[sl, :length],
            rewards=self.rewards[sl],
            real_rows=self.real_rows,
            lengths=self.lengths[sl],
        )


def collate(
    trajectories: list[Trajectory],
    *,
    pad_id: int,
    rows: int,
    scale_by_std: bool = True,
    first_row: int = 0,
    pad_first_row: int | None = None,
    width: int | None = None,
) -> TrainBatch:
    """Pad `trajectories` (whole groups, rewards set) into a TrainBatch of exactly `rows` rows.

    Token uid = global row x UID_STRIDE + position. Several data-parallel ranks: each passes
    `first_row` = the step-global index of its first trajectory (the trajectories of the ranks
    before it), `pad_first_row` = where its padding rows are numbered (after every rank's
    trajectories and the padding rows of the ranks before it), so uids are unique over the step
    and a rank's trajectories get exactly the uids they have in a one-process step; and `width` =
    the longest response of all ranks, so every rank's [S, L] has the same L, as
    `collectives.gather_step_tokens` needs. One process: the defaults."""
    if len(trajectories) > rows:
        raise ValueError(f"{len(trajectories)} trajectories do not fit a step of {rows} rows")
    group_ids = {g: i for i, g in enumerate(dict.fromkeys(t.group_id for t in trajectories))}
    rewards = torch.tensor([float(t.reward) for t in trajectories], dtype=torch.float32)  # [N]
    groups = torch.tensor([group_ids[t.group_id] for t in trajectories], dtype=torch.long)  # [N]
    adv = grpo_advantages(rewards, groups, len(group_ids), scale_by_std=scale_by_std)  # [N]

    P = max((len(t.prompt_token_ids) for t in trajectories), default=1)  # a rank may get no trajectory
    L = max((len(t.response_token_ids) for t in trajectories), default=1)
    if width is not None:
        if width < L:
            raise ValueError(f"width {width} is shorter than the longest response ({L} tokens)")
        L = width
    if L >= UID_STRIDE:
        raise ValueError(f"responses of {L} tokens do not fit the token uid stride {UID_STRIDE}")
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
    n = len(trajectories)
    pad_first_row = first_row + n if pad_first_row is None else pad_first_row
    row_id = torch.cat([first_row + torch.arange(n), pad_first_row + torch.arange(rows - n)])  # [S] global rows
    uid = row_id[:, None] * UID_STRIDE + torch.arange(L)[None, :]
    ids = torch.from_numpy(input_ids)
    return TrainBatch(
        input_ids=ids,
        attention_mask=attention_t,
        position_ids=position_ids,
        prompt_width=P,
        response_ids=ids[:, P:],
        mask=mask_t,
        rollout_logprobs=torch.from_numpy(rollout_lp),
        advantages=broadcast_to_tokens(seq_adv, mask_t),
        token_uid=uid,
        rewards=seq_rewards,
        real_rows=len(trajectories),
        lengths=tuple(len(t.response_token_ids) for t in trajectories) + (1,) * (rows - len(trajectories)),
        prompts=tuple(np.asarray(t.prompt_token_ids) for t in trajectories),
        responses=tuple(np.asarray(t.response_token_ids) for t in trajectories),
    )


def token_logprobs_and_entropy(
    logits: Tensor,  # [B, P + L, V]
    batch: TrainBatch,
) -> tuple[Tensor, Tensor]:  # logprobs [B, L], entropy [B, L]
    """log pi(response token) and the entropy of each response position's distribution (fp32)."""
    L = batch.response_ids.shape[1]
    P = batch.prompt_width
    resp_logits = logits[:, P - 1 : P - 1 + L]  # [B, L, V]
    resp_logits = resp_logits.to(torch.promote_types(resp_logits.dtype, torch.float32))  # >= fp32
    logp_full = torch.log_softmax(resp_logits, -1)  # [B, L, V]
    logprobs = logp_full.gather(-1, batch.response_ids[..., None]).squeeze(-1)  # [B, L]
    entropy = -(logp_full.exp() * logp_full).sum(-1)  # [B, L]
    return logprobs, entropy
