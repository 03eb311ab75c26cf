import pytest
import torch
from algo_helpers import random_step, step_tokens

from learner.algorithm.selection import hash_uniform, in_topk, topk_count, topk_threshold
from learner.algorithm.step_plan import plan_step
from stare.config.algo import StareLossConfig


@pytest.mark.parametrize(
    "n, fraction, expected",
    [(30, 0.1, 3), (10, 0.1, 1), (11, 0.1, 2), (5, 0.01, 1), (0, 0.1, 0), (7, 0.0, 0), (7, 1.0, 7), (3, 0.5, 2)],
)
def test_topk_count_is_ceil_at_least_one(n, fraction, expected):
    assert int(topk_count(torch.tensor(n), fraction)) == expected


def test_topk_count_floor_mode_for_cov_baselines():
    assert int(topk_count(torch.tensor(10_000), 2e-4, rounding="floor")) == 2
    assert int(topk_count(torch.tensor(100), 2e-4, rounding="floor")) == 1  # at least one


def test_ties_at_threshold_break_by_uid():
    key = torch.tensor([3.0, 1.0, 3.0, 2.0, 3.0])
    uid = torch.tensor([4, 0, 2, 1, 3])
    member = torch.ones(5, dtype=torch.bool)
    thr = topk_threshold(key, uid, member, torch.tensor(2))
    # order: (3, uid 2), (3, uid 3), (3, uid 4), (2, 1), (1, 0) -> the 2nd is (3, uid 3)
    assert float(thr.key) == 3.0 and int(thr.uid) == 3
    assert in_topk(key, uid, member, thr).tolist() == [False, False, True, False, True]


def test_non_members_are_never_selected():
    key = torch.tensor([9.0, 1.0, 2.0])
    uid = torch.arange(3)
    member = torch.tensor([False, True, True])
    thr = topk_threshold(key, uid, member, torch.tensor(1))
    assert in_topk(key, uid, member, thr).tolist() == [False, False, True]


def test_empty_subset_selects_nothing():
    key = torch.tensor([1.0, 2.0])
    member = torch.zeros(2, dtype=torch.bool)
    thr = topk_threshold(key, torch.arange(2), member, torch.tensor(0))
    assert not in_topk(key, torch.arange(2), member, thr).any()


def test_empty_step_selects_nothing():
    thr = topk_threshold(
        torch.empty(0), torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.bool), torch.tensor(0)
    )
    assert torch.isinf(thr.key) and int(thr.uid) == -1


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.25, 0.5, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stare_selects_exactly_ceil_fraction_per_sign_despite_ties(fraction, seed):
    s = random_step(seed, rows=16, length=20, tie_decimals=0)  # heavy ties
    ctx = plan_step(step_tokens(s), StareLossConfig(top_fraction=fraction), gate=1.0, w=1.1, m=0.9)
    surprisal = -s["old"]
    for sign, thr in ((1, ctx.pos_threshold), (-1, ctx.neg_threshold)):
        member = s["mask"] & (s["adv"] * sign > 0)
        n = int(member.sum())
        sel = in_topk(surprisal, s["uid"], member, thr)
        expected = 0 if fraction == 0 else (max(1, -(-n * fraction // 1)) if n else 0)
        expected = min(int(expected), n)
        assert int(sel.sum()) == expected
        if 0 < expected < n:  # every selected token is at least as surprising as every unselected member
            assert surprisal[sel].min() >= surprisal[member & ~sel].max()


def test_selection_is_the_same_whatever_the_row_order_of_the_gathered_step():
    # Ranks gather rows in different orders (rank-major); uids, not positions, decide ties.
    s = random_step(3, rows=12, length=10, tie_decimals=0)
    cfg = StareLossConfig(top_fraction=0.3)
    tokens = step_tokens(s)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    shuffled = type(tokens)(*(getattr(tokens, f)[perm] for f in tokens.__dataclass_fields__))
    a = plan_step(tokens, cfg, gate=1.0, w=1.1, m=0.9)
    b = plan_step(shuffled, cfg, gate=1.0, w=1.1, m=0.9)
    assert torch.equal(a.pos_threshold.key, b.pos_threshold.key) and torch.equal(
        a.pos_threshold.uid, b.pos_threshold.uid
    )
    assert torch.equal(a.neg_threshold.key, b.neg_threshold.key) and torch.equal(
        a.neg_threshold.uid, b.neg_threshold.uid
    )


def test_hash_uniform_matches_reference_splitmix64():
    def splitmix64(x: int) -> int:
        mask = (1 << 64) - 1
        z = (x + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    uid = torch.tensor([0, 1, 12345, (1 << 40) + 7])
    expected = [(splitmix64(int(u) + 5 * 0x9E3779B97F4A7C15) >> 11) / 2**53 for u in uid]
    assert hash_uniform(uid, seed=5).tolist() == expected
