"""A step's rows -> micro-batches: fixed row counts, or token budgets with packed sequences.

Two ways to cut a step (`optim.max_tokens_per_micro_batch`):
- None: `optim.micro_batch` rows at a time in step order, each micro-batch padded to its own
  longest prompt (left) and response (right).
- a budget of T tokens: rows sorted by length (longest first) and placed first-fit into
  micro-batches of at most T tokens. Packed (`optim.pack_sequences`, the default), a
  micro-batch's prompt+response sequences are concatenated into rows as wide as its longest
  sequence (first fit, longest first), with `position_ids` restarting at 0 for each sequence and
  no attention mask: transformers builds the block-diagonal causal mask from the positions
  (sdpa/eager; flash-attention's varlen kernel), so no padding is computed but the rows' short
  tails; attention costs rows x width^2 rather than (all tokens)^2. The budget counts the
  sequences' tokens. Unpacked, each micro-batch is a padded block of rows whose rows x (longest
  prompt + longest response) fits the budget. A sequence longer than the budget gets a
  micro-batch of its own (it cannot be split).
The loss normalisers are step-global (`plan_step`), so how the rows are cut changes no loss
value, only float rounding. Rows without tokens (the step's padding rows) get no micro-batch.

`MicroBatch` carries the index maps that move between the model's layout and the loss's
[B, length] layout: `pred_index` (the flat model position whose hidden state predicts each
response token) and `token_index` (that token's flat place in [B, length]). Everything is built
on the host from host ints; `to(device)` moves it once (pinned, non-blocking on CUDA).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class MicroBatch:
    rows: Tensor  # [B] long, the step rows (into the step's [S, L] tensors)
    input_ids: Tensor  # [R, T] long; R = B padded, R <= B packed
    position_ids: Tensor  # [R, T] long
    attention_mask: Tensor | None  # [R, T] long; None when packed (the positions delimit sequences)
    pred_index: Tensor  # [N] long, flat index into [R * T] of the position predicting each response token
    targets: Tensor  # [N] long, the response tokens
    token_index: Tensor  # [N] long, flat index into [B, length] of each response token
    length: int  # longest response of these rows (host int)
    model_tokens: int  # R x T positions the model computes (host int)
    filler: bool = False  # a no-token stand-in that keeps ranks' micro-batch counts equal
    # output-head calls at least (several ranks: the ranks' largest chunk count of this micro-batch,
    # so that under ZeRO-3 every rank gathers the head's weight as often as the others)
    min_chunks: int = 1

    def to(self, device: torch.device) -> MicroBatch:
        """Every tensor on `device`; from pinned memory without blocking when it is CUDA."""
        cuda = torch.device(device).type == "cuda"

        def move(t: Tensor | None) -> Tensor | None:
            if t is None:
                return None
            return (t.pin_memory() if cuda else t).to(device, non_blocking=cuda)

        return replace(
            self,
            **{f.name: move(getattr(self, f.name)) for f in fields(self) if isinstance(getattr(self, f.name), Tensor)},
        )


def plan_rows(
    prompt_lens: Sequence[int],
    response_lens: Sequence[int],
    *,
    micro_batch: int,
    max_tokens: int | None,
    pack: bool,
) -> list[list[int]]:
    """The rows of each micro-batch (host ints, no tensors)."""
    n = len(response_lens)
    if max_tokens is None:
        return [list(range(a, min(a + micro_batch, n))) for a in range(0, n, micro_batch)]
    total = [p + r for p, r in zip(prompt_lens, response_lens)]
    order = sorted(range(n), key=lambda i: (-total[i], i))  # longest first, ties in step order

    def cost(rows: list[int]) -> int:  # model tokens of a micro-batch of these rows
        if pack:
            return sum(total[i] for i in rows)
        return len(rows) * (max(prompt_lens[i] for i in rows) + max(response_lens[i] for i in rows))

    bins: list[list[int]] = []
    for i in order:  # first fit, longest first
        for rows in bins:
            if cost(rows + [i]) <= max_tokens:
                rows.append(i)
                break
        else:
            bins.append([i])
    return [sorted(rows) for rows in bins]


def build_micro_batch(
    rows: Sequence[int],
    prompts: Sequence[np.ndarray],  # per step row, prompt token ids
    responses: Sequence[np.ndarray],  # per step row, response token ids
    *,
    pad_id: int,
    pack: bool,
) -> MicroBatch:
    """Host tensors of one micro-batch (packed into one row, or padded)."""
    ps = [np.asarray(prompts[i], dtype=np.int64) for i in rows]
    rs = [np.asarray(responses[i], dtype=np.int64) for i in rows]
    if any(len(p) == 0 for p in ps):
        raise ValueError("a trajectory has an empty prompt: the first response token has no position to predict it")
    length = max(len(r) for r in rs)
    token_index = np.concatenate([b * length + np.arange(len(r)) for b, r in enumerate(rs)])
    targets = np.concatenate(rs)
    if pack:
        # Sequences into rows as wide as the longest one, first fit longest first: attention
        # (a block-diagonal mask under sdpa) costs rows x width^2, not (all tokens)^2.
        seqs = [np.concatenate([p, r]) for p, r in zip(ps, rs)]
        width = max(len(q) for q in seqs)
        fill: list[int] = []
        place: dict[int, tuple[int, int]] = {}  # sequence -> (row, offset)
        for b in sorted(range(len(seqs)), key=lambda b: (-len(seqs[b]), b)):
            row = next((i for i, f in enumerate(fill) if f + len(seqs[b]) <= width), len(fill))
            if row == len(fill):
                fill.append(0)
            place[b] = (row, fill[row])
            fill[row] += len(seqs[b])
        T = max(fill)
        input_ids = np.full((len(fill), T), pad_id, dtype=np.int64)
        # a row's unused tail restarts at position 0: a block of its own that nothing reads
        position_ids = np.arange(T)[None, :] - np.asarray(fill)[:, None]  # [R, T]; < fill: overwritten below
        pred_parts = []
        for b, q in enumerate(seqs):
            row, off = place[b]
            input_ids[row, off : off + len(q)] = q
            position_ids[row, off : off + len(q)] = np.arange(len(q))
            pred_parts.append(row * T + off + len(ps[b]) - 1 + np.arange(len(rs[b])))
        pred = np.concatenate(pred_parts)
        attention = None
    else:
        P = max(len(p) for p in ps)
        T = P + length
        input_ids = np.full((len(rows), T), pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), T), dtype=np.int64)
        for b, (p, r) in enumerate(zip(ps, rs)):
            input_ids[b, P - len(p) : P + len(r)] = np.concatenate([p, r])
            mask[b, P - len(p) : P + len(r)] = 1
        position_ids = np.clip(mask.cumsum(-1) - 1, 0, None)
        pred = np.concatenate([b * T + P - 1 + np.arange(len(r)) for b, r in enumerate(rs)])
        attention = torch.from_numpy(mask)
    return MicroBatch(
        rows=torch.tensor(list(rows), dtype=torch.long),
        input_ids=torch.from_numpy(input_ids),
        position_ids=torch.from_numpy(np.ascontiguousarray(position_ids)),
        attention_mask=attention,
        pred_index=torch.from_numpy(pred.astype(np.int64)),
        targets=torch.from_numpy(targets),
        token_index=torch.from_numpy(token_index.astype(np.int64)),
        length=length,
        model_tokens=int(input_ids.size),
    )


def filler_micro_batch(pad_id: int, *, pack: bool) -> MicroBatch:
    """A one-token stand-in for row 0 that trains nothing (its loss has no token): a rank with fewer
    micro-batches runs these so every rank runs the same forwards, backwards and collectives."""
    ids = torch.full((1, 2), pad_id, dtype=torch.long)
    return MicroBatch(
        rows=torch.zeros(1, dtype=torch.long),
        input_ids=ids,
        position_ids=torch.arange(2)[None],
        attention_mask=None if pack else torch.ones(1, 2, dtype=torch.long),
        pred_index=torch.zeros(1, dtype=torch.long),
        targets=torch.full((1,), pad_id, dtype=torch.long),
        token_index=torch.zeros(1, dtype=torch.long),
        length=1,
        model_tokens=2,
        filler=True,
    )
