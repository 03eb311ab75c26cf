"""Several optimizer updates per batch (PPO mini-batches and epochs): the cut and the metrics.

A batch of this rank's trajectories is cut into `optim.mini_batches` consecutive shares of whole
groups (`mini_batch_rows`); the learner runs `optim.epochs` passes over them, one optimizer update
per share and pass, every update against the batch's old log-probs from the pre-pass. An update's
tokens over every rank decide its selections and normalisers (`update_tokens` then `plan_step`).

The metrics: each update's sums are reduced over ranks and read once (`update_metrics`); the step's
metrics combine them (`combine_updates`). With one update per batch the step's metrics are that
update's, exactly as before mini-batches existed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from torch import Tensor

from learner.algorithm.step_plan import StepTokens

SEED_STRIDE = 1_000_000_007  # update u of a step draws with the step's seed + u x this (update 0: the step's seed)
# the update's aggregate loss values (and the regularizers' aggregates): averaged over updates
AVERAGED = ("loss", "entropy_bonus", "ref_kl_loss")
UPDATE_SUMS = (
    "clipped_tokens",
    "clip_low_tokens",
    "clip_high_tokens",
    "approx_kl_sum",
    "ratio_sum",
    "ratio_sq_sum",
)  # how far each update moved: over every update's tokens


def split_groups(trajectories: Sequence, world: int) -> list[list]:
    """The step's trajectories (whole groups, consecutive) cut into `world` shares of whole groups,
    rank r getting groups [r*n/world, (r+1)*n/world): the shares differ by one group at most, and
    concatenated in rank order they are the step's rows in order (the one-rank step's token uids).
    A rank may get no group (fewer groups than ranks)."""
    starts = [i for i, t in enumerate(trajectories) if i == 0 or t.group_id != trajectories[i - 1].group_id]
    bounds = starts + [len(trajectories)]
    n = len(starts)
    cuts = [bounds[r * n // world] for r in range(world)] + [len(trajectories)]
    return [list(trajectories[cuts[r] : cuts[r + 1]]) for r in range(world)]


def mini_batch_rows(trajectories: Sequence, mini_batches: int) -> list[list[int]]:
    """The rows (indices into `trajectories`) of each mini-batch: consecutive shares of whole groups
    differing by one group at most (`split_groups`); a share may be empty on a rank with fewer groups."""
    out, start = [], 0
    for share in split_groups(trajectories, mini_batches):
        out.append(list(range(start, start + len(share))))
        start += len(share)
    return out


def update_tokens(tokens: StepTokens, row_update: Tensor, update: int) -> StepTokens:
    """The step's tokens with the mask kept on `update`'s rows only ([S] row_update: each row's
    mini-batch, -1 for padding rows; all ranks, in the order of `tokens`)."""
    return dataclasses.replace(tokens, mask=tokens.mask & (row_update == update)[:, None])


def update_metrics(totals: dict[str, float], n_tokens: float, grad_norm: float | None) -> dict[str, float | None]:
    """One update's metrics from its reduced sums: per-token means over the update's loss tokens."""
    tokens = max(totals.get("train_tokens", 0.0), 1.0)
    mean_r = totals.get("ratio_sum", 0.0) / tokens
    var_r = max(totals.get("ratio_sq_sum", 0.0) / tokens - mean_r * mean_r, 0.0)
    return {
        "loss": totals["loss"],
        "clip_fraction": totals.get("clipped_tokens", 0.0) / max(n_tokens, 1.0),
        "clip_fraction_low": totals.get("clip_low_tokens", 0.0) / tokens,
        "clip_fraction_high": totals.get("clip_high_tokens", 0.0) / tokens,
        "approx_kl": totals.get("approx_kl_sum", 0.0) / tokens,
        "ratio_mean": mean_r,
        "ratio_std": math.sqrt(var_r),
        "grad_norm": grad_norm,
    }


def combine_updates(updates: list[dict[str, Any]], epochs: int) -> tuple[dict[str, Any], dict[str, float]]:
    """The step's metrics from its updates (each {"epoch", "totals", "n_tokens", "grad_norm"}), and
    the batch's other sums. Loss (and entropy bonus) and gradient norm: averaged over the updates;
    clip fractions, approx-KL and the ratio's spread: over every update's tokens; every other sum
    (token counts, entropy, rollout gap, selections): of the first epoch, i.e. of the batch once.
    With several updates, `per_update` holds each update's metrics."""
    keys = sorted({k for u in updates for k in u["totals"]})
    every = {k: sum(u["totals"].get(k, 0.0) for u in updates) for k in keys}
    first = {k: sum(u["totals"].get(k, 0.0) for u in updates if u["epoch"] == 0) for k in keys}
    step: dict[str, Any] = update_metrics(every, sum(u["n_tokens"] for u in updates), None)
    for k in AVERAGED:
        if k in every:
            step[k] = first[k] = every[k] / len(updates)
    norms = [u["grad_norm"] for u in updates]
    step["grad_norm"] = None if any(n is None for n in norms) else sum(norms) / len(norms)
    if len(updates) > 1:
        step["per_update"] = {
            str(i): update_metrics(u["totals"], u["n_tokens"], u["grad_norm"]) for i, u in enumerate(updates)
        }
    step.update(updates=len(updates), epochs=epochs)
    for k in UPDATE_SUMS + ("loss",):
        first.pop(k, None)
    if "ref_kl_sum" in first:  # the reference KL's token mean over the batch (the first epoch's)
        step["ref_kl"] = first.pop("ref_kl_sum") / max(first.pop("ref_kl_tokens"), 1.0)
    return step, first
