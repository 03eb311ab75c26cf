"""Split-invariant top-k token selection over a whole optimizer step.

STARE (and Clip-Cov, KL-Cov, the 80/20 update) pick the top fraction of a token subset by some key
(surprisal, covariance, entropy). The reference implementation picks inside each micro-batch on
each GPU; we pick over the whole step: every rank sees the keys of every token of the step once,
before the first backward, and reduces them to a threshold `(key, uid)`. A token is selected iff it
is a member and `(key, -uid)` is lexicographically >= the threshold's. Because `uid` is a global
token id (sample index in the step x max length + position), the order is total and the selected
set is identical however the step is split into micro-batches or data-parallel ranks.

Limits: keys must not be NaN. Everything is tensor ops: no `.item()`, no data-dependent Python
branch; the only branch is on a tensor's *shape* (an empty step).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

# Relative slack when turning fraction x n into a count: 0.1 * 30 is 3.0000000000000004 in float64,
# whose ceil would be 4.
_COUNT_SLACK = 1e-9


class TopKThreshold(NamedTuple):
    key: Tensor  # [] key of the last selected token (+inf when nothing is selected)
    uid: Tensor  # [] int64 uid of the last selected token (-1 when nothing is selected)


def topk_count(n: Tensor, fraction: float, *, rounding: str = "ceil", at_least_one: bool = True) -> Tensor:
    """How many of n members to select: ceil(fraction x n) (or floor), at least one when n > 0 and
    fraction > 0; zero when fraction == 0. n: [] integer tensor. Returns [] int64."""
    n_f = n.to(torch.float64)
    scaled = n_f * fraction
    if rounding == "ceil":
        k = torch.ceil(scaled * (1 - _COUNT_SLACK))
    elif rounding == "floor":
        k = torch.floor(scaled * (1 + _COUNT_SLACK))
    else:
        raise ValueError(f"rounding must be 'ceil' or 'floor', got {rounding!r}")
    k = torch.minimum(k, n_f)
    if at_least_one and fraction > 0:
        k = torch.where(n_f > 0, k.clamp(min=1), k)
    return k.to(torch.int64)


def topk_thresholds(
    key: Tensor,  # [N] float, finite
    uid: Tensor,  # [N] int64, unique
    members: list[Tensor],  # each [N] bool, a subset
    ks: list[Tensor],  # each [] int64, how many of that subset to select (<= its size)
) -> list[TopKThreshold]:
    """For each subset, the (key, uid) of its k-th member in the order key descending, uid ascending.

    One sort of the step's tokens serves every subset: the k-th member is where the running count
    of members in sorted order reaches k."""
    none = TopKThreshold(key.new_full((), torch.inf), torch.full((), -1, dtype=torch.int64, device=key.device))
    if key.numel() == 0:
        return [none for _ in members]
    order = torch.argsort(uid, stable=True)  # [N] uid ascending
    order = order[torch.argsort(key[order], descending=True, stable=True)]  # key descending, ties by uid
    out = []
    for member, k in zip(members, ks):
        in_order = member[order]  # [N]
        reached = in_order & (torch.cumsum(in_order, 0) == k)  # [N] True exactly at the k-th member
        # Tensor indices through index_select: `order[i]` with a tensor i would sync to the host.
        last = order.index_select(0, torch.argmax(reached.to(torch.int8)).reshape(1))  # [1]
        has = k > 0
        out.append(
            TopKThreshold(
                torch.where(has, key.index_select(0, last)[0], none.key),
                torch.where(has, uid.index_select(0, last)[0], none.uid),
            )
        )
    return out


def topk_threshold(key: Tensor, uid: Tensor, member: Tensor, k: Tensor) -> TopKThreshold:
    """`topk_thresholds` for one subset."""
    return topk_thresholds(key, uid, [member], [k])[0]


def in_topk(
    key: Tensor,  # [...] float
    uid: Tensor,  # [...] int64
    member: Tensor,  # [...] bool
    threshold: TopKThreshold,
) -> Tensor:  # [...] bool
    """Whether each token is among the selected: a member ranked at or before the threshold."""
    above = key > threshold.key
    tie = (key == threshold.key) & (uid <= threshold.uid)
    return member & (above | tie)


# splitmix64 constants as signed int64 (torch has no uint64 arithmetic).
_MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685  # 0x94D049BB133111EB


def _lshr(x: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def hash_uniform(uid: Tensor, seed: int) -> Tensor:
    """A deterministic pseudo-random float64 in [0, 1) per uid (splitmix64 of uid + seed).

    Used where a baseline picks tokens at random (Clip-Cov): keyed by uid, so the draw does not
    depend on how the step is split.
    """
    offset = ((seed + 1) * 0x9E3779B97F4A7C15) % (1 << 64)  # (seed + 1) x golden, wrapped
    z = uid.to(torch.int64) + (offset - (1 << 64) if offset >= 1 << 63 else offset)
    z = (z ^ _lshr(z, 30)) * _MIX1
    z = (z ^ _lshr(z, 27)) * _MIX2
    z = z ^ _lshr(z, 31)
    return _lshr(z, 11).to(torch.float64) / float(1 << 53)
