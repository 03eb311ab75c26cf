"""Several learner ranks driven from rank 0 (learner.process.ranks): the shares of a step, and a real
2-rank DeepSpeed learner (gloo) whose steps, published weights and checkpoint equal one rank's."""

import pytest
import torch
from learner_helpers import leader_follower_worker, save_random_qwen2, trajectories
from rank_helpers import spawn_ranks

from learner.process.ranks import split_groups
from stare.config import build_config

COMMON = [
    "rollout.prompts_per_step=3",
    "rollout.samples_per_prompt=4",
    "optim.micro_batch=12",
    "optim.lr=1e-3",
    "optim.grad_clip=1000",
    "controller.target=10",
    "optim.logits_chunk_tokens=4",
    "optim.max_tokens_per_micro_batch=24",
]
COMPARED = ("loss", "entropy", "grad_norm", "clip_fraction", "omega_sum", "train_tokens", "w", "gate")


def test_shares_are_whole_groups_in_step_order():
    trajs = trajectories(0, groups=5, group_size=2)
    shares = split_groups(trajs, 2)
    assert [len(s) for s in shares] == [4, 6]  # groups [0, 2) and [2, 5)
    assert [t for s in shares for t in s] == trajs  # concatenated in rank order: the step's rows
    for share in shares:
        ids = [t.group_id for t in share]
        assert all(ids.count(g) == 2 for g in ids)  # no group is cut


def test_a_rank_may_get_no_group():
    trajs = trajectories(0, groups=1, group_size=4)
    assert [len(s) for s in split_groups(trajs, 3)] == [0, 0, 4]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_qwen2(tmp_path_factory.mktemp("model") / "m")


def _one_rank(model_dir, extra, steps):
    from learner.step.trainer import Learner

    learner = Learner(build_config({}, overrides=COMMON + extra), model_dir, pad_id=0)
    metrics = [learner.train_step(trajectories(i)[: groups * 4]) for i, groups in enumerate(steps)]
    return metrics, learner.state_dict_for_rollout()


NO_PREPASS = [  # STARE keyed on the rollout's log-probs: the second step runs no pre-pass on any rank
    "loss.selection_keys=rollout",
    "controller.entropy_source=lagged",
    "diagnostics.predicted_entropy_change=false",
]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [["optim.zero_stage=1"], ["optim.zero_stage=3"], ["optim.zero_stage=3", *NO_PREPASS]])
def test_two_ranks_driven_from_rank_0_give_the_one_rank_steps_weights_and_checkpoint(model_dir, tmp_path, extra):
    # step 1: 3 groups (rank 0 gets 1, rank 1 gets 2); step 2: 1 group (rank 0 gets none: it runs
    # only fillers, with as many head calls as rank 1's chunks)
    steps = [3, 1]
    one, one_state = _one_rank(model_dir, extra, steps)
    spawn_ranks(leader_follower_worker, 2, str(model_dir), str(tmp_path), COMMON + extra, steps, timeout_s=300)
    got = torch.load(tmp_path / "leader.pt")
    for step, (mine, ref) in enumerate(zip(got["metrics"], one)):
        for key in COMPARED:
            assert mine[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6), (step, key)
    assert got["state"].keys() == one_state.keys()
    for name, tensor in one_state.items():
        torch.testing.assert_close(got["state"][name], tensor, rtol=0, atol=1e-6, msg=name)
    assert got["loaded"] == "x" and got["version"] == len(steps)  # the checkpoint's version, on rank 0
    if NO_PREPASS[0] in extra:
        assert [m["prepass"] for m in got["metrics"]] == [1, 0]


def test_a_follower_gives_up_when_rank_0_goes_silent(tmp_path):
    from learner_helpers import silent_leader_worker

    spawn_ranks(silent_leader_worker, 2, str(tmp_path), timeout_s=60)
    waited, outcome = (tmp_path / "follower.txt").read_text().split("\n", 1)
    assert "nothing from rank 0" in outcome and "dead or hung" in outcome
    assert float(waited) < 7  # the channel's 2 s timeout, not rank 0's 8 s silence
