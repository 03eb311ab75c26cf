"""`collate` on several data-parallel ranks: token uids unique across ranks and one [S, L] for all,
so the step's selection counts k tokens whatever the ranks' tokens look like (2 gloo processes)."""

import torch
from learner_helpers import collate_rank_worker
from rank_helpers import spawn_ranks


def test_two_ranks_with_equal_first_tokens_select_exactly_k(tmp_path):
    world = 2
    spawn_ranks(collate_rank_worker, world, str(tmp_path))
    results = [torch.load(tmp_path / f"rank{r}.pt")["global"] for r in range(world)]
    control = [torch.load(tmp_path / f"rank{r}.pt")["per_rank"] for r in range(world)]

    # rank 0's responses have 3 tokens, rank 1's 7: both pad to the common width
    assert [r["shape"] for r in results] == [(2, 7), (2, 7)]
    first = results[0]["first_uids"]
    assert len(set(first)) == 4 and first == results[1]["first_uids"]  # unique over the step, same on every rank
    # the two rows with A > 0 (one per rank) have first tokens of equal surprisal; k = ceil(0.1 x 10) = 1
    assert [r["selected"] for r in results] == [1, 1]
    # the control: rows numbered from 0 on every rank (collate before the fix) tie both ranks'
    # first tokens on uid too, and 2 tokens are selected where k = 1
    assert [r["selected"] for r in control] == [2, 2]
