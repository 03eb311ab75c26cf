"""The pre-pass ahead of a step (`Learner.prepare`, learner/step/trainer.py): a step whose rows were
prepared at its weights gives what the same step computing its whole pre-pass gives (metrics and
updated weights; the micro-batch cut of the prepared values differs, so within fp32 rounding), and
values prepared at older weights are never used. Real DeepSpeed on CPU, fp32, ZeRO-0 unless said."""

import pytest
import torch
from learner_helpers import (
    SMALL_STEP,
    build_learner,
    flat_weights,
    prepare_rank_worker,
    save_random_qwen2,
    trajectories,
)
from rank_helpers import spawn_ranks

from stare.config import build_config

COMMON = [
    *SMALL_STEP,
    "diagnostics.predicted_entropy_change=true",
    "controller.target=10",
]
COMPARED = (
    "loss",
    "entropy",
    "gate",
    "clip_fraction",
    "omega_sum",
    "rollout_logprob_gap",
    "train_tokens",
    "quadrant/pos_high/fraction",
    "quadrant/neg_low/predicted_dH",
    "rollout_mismatch_k3",
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_qwen2(tmp_path_factory.mktemp("model") / "m")


def _learner(model_dir, extra=()):
    return build_learner(model_dir, COMMON + list(extra))


def _assert_same_step(got, want):
    (metrics, weights), (ref, ref_weights) = got, want
    for key in COMPARED:
        assert metrics[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6), key
    torch.testing.assert_close(weights, ref_weights, rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def unprepared(model_dir):
    """The reference: the step on the three groups of `trajectories(0)`, its own pre-pass."""
    learner = _learner(model_dir)
    metrics = learner.train_step(trajectories(0))
    assert metrics["prepared_rows"] == 0 and metrics["gate"] == 1  # STARE reweights: W and the selection count
    assert not torch.equal(flat_weights(learner), flat_weights(_learner(model_dir)))  # the step moved the weights
    return metrics, flat_weights(learner)


def test_a_step_whose_rows_were_all_prepared_is_the_unprepared_step(model_dir, unprepared):
    learner, trajs = _learner(model_dir), trajectories(0)
    # prepared in two calls, groups 2 then 0 and 1: other micro-batches than the step's (5 rows in order)
    learner.prepare(trajs[8:])
    learner.prepare(trajs[:8])
    metrics = learner.train_step(trajs)
    assert metrics["prepared_rows"] == 12 and metrics["prepass_micro_batches"] == 0  # no pre-pass at step time
    _assert_same_step((metrics, flat_weights(learner)), unprepared)


def test_a_step_with_some_rows_prepared_is_the_unprepared_step(model_dir, unprepared):
    learner, trajs = _learner(model_dir), trajectories(0)
    learner.prepare(trajs[4:8])  # group 1 of 3
    metrics = learner.train_step(trajs)
    assert metrics["prepared_rows"] == 4 and metrics["prepass_micro_batches"] == 2  # 8 rows in micro-batches of 5
    _assert_same_step((metrics, flat_weights(learner)), unprepared)


def test_the_kept_values_are_what_the_step_uses(model_dir, unprepared):
    # control for the two tests above: values kept at the step's version do enter the step
    learner, trajs = _learner(model_dir), trajectories(0)
    learner.prepare(trajs)
    for v in learner.prepared.values.values():
        v[0] -= 0.5  # every old log-prob half a nat lower: ratios exp(0.5), the clip engages
    metrics = learner.train_step(trajs)
    assert metrics["prepared_rows"] == 12
    assert metrics["clip_fraction"] > unprepared[0]["clip_fraction"] + 0.1


def test_values_prepared_at_older_weights_are_recomputed(model_dir):
    first, second = trajectories(1)[:8], trajectories(0)
    ref = _learner(model_dir)
    ref.train_step(first)
    want = ref.train_step(second), flat_weights(ref)
    learner = _learner(model_dir)
    learner.prepare(second)  # at version 0; the step below trains at version 1
    learner.train_step(first)
    metrics = learner.train_step(second)
    assert metrics["prepared_rows"] == 0 and metrics["prepass_micro_batches"] == 3  # 12 rows in micro-batches of 5
    _assert_same_step((metrics, flat_weights(learner)), want)
    # a control: the values of version 0 are not the recomputed ones (using them would change the step)
    stale = _learner(model_dir)
    stale.prepare(second)
    values = stale.prepass_values(second)
    stale.train_step(first)
    fresh = stale.prepass_values(second)
    assert max((values[k] - fresh[k]).abs().max().item() for k in values) > 1e-3


def test_two_ranks_prepared_elsewhere_give_the_one_rank_unprepared_step(model_dir, tmp_path):
    # ZeRO-3 over 2 ranks: rank 0 prepares group 1 and rank 1 group 2 (PREPARE op), then the step
    # gives rank 0 group 0 (nothing prepared: its own micro-batches) and rank 1 groups 1 and 2 (all
    # prepared, one of them on rank 0: the TRAIN op carries them), so rank 1 runs only filler
    # pre-pass forwards, as many as rank 0's, with as many head calls.
    extra = ["optim.zero_stage=3", "optim.logits_chunk_tokens=4", "optim.max_tokens_per_micro_batch=24"]
    from learner.step.trainer import Learner

    one = Learner(build_config({}, overrides=COMMON + extra), model_dir, pad_id=0)
    want = one.train_step(trajectories(0))
    want_state = one.state_dict_for_rollout()
    spawn_ranks(prepare_rank_worker, 2, str(model_dir), str(tmp_path), COMMON + extra, timeout_s=300)
    got = torch.load(tmp_path / "leader.pt")
    assert got["kept"] == [f"0-{g}-{s}" for g in (1, 2) for s in range(4)]  # rank 0 kept both ranks' values
    assert got["metrics"]["prepared_rows"] == 8
    for key in COMPARED:
        assert got["metrics"][key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key
    for name, tensor in want_state.items():
        torch.testing.assert_close(got["state"][name], tensor, rtol=0, atol=1e-6, msg=name)


@pytest.mark.slow
def test_the_session_prepares_while_it_waits_and_the_run_is_unchanged(fast_overrides):
    # stare train (embedded, the real session), on-policy rounds over-sampled x2: a round publishes 4
    # groups and each pump samples 2, so after the first pump the step waits (for the round's rest)
    # with 2 groups ready: the session prepares them, and the step trains them (the first in publish order)
    import json

    from stare.app.launch.embedded import run_training
    from stare.app.launch.run_folder import prepare_run

    common = fast_overrides + ["run.steps=3", "data.oversample=2.0", "controller.target=5.0"]
    runs = {
        on: run_training(
            prepare_run(
                build_config({}, overrides=common + [f"run.name=early-{on}", f"optim.prepass_early={str(on).lower()}"]),
                None,
            ),
            progress=False,
        )
        for on in (True, False)
    }
    lines = {on: [json.loads(s) for s in (d / "metrics.jsonl").read_text().splitlines()] for on, d in runs.items()}
    trained = {on: (d / "trained.jsonl").read_text() for on, d in runs.items()}
    assert [m["prepared_groups"] for m in lines[True]] == [2, 2, 2]
    assert [m["prepared_rows"] for m in lines[True]] == [8, 8, 8]  # every row of every step prepared ahead
    assert [m["prepass_micro_batches"] for m in lines[True]] == [0, 0, 0]
    assert [m["prepared_groups"] for m in lines[False]] == [0, 0, 0]
    assert [m["prepared_rows"] for m in lines[False]] == [0, 0, 0]
    assert trained[True] == trained[False]  # the same trajectories, step by step
    for on, off in zip(lines[True], lines[False]):
        assert on["gate"] == 1
        for key in (
            "loss",
            "entropy",
            "reward_mean",
            "gate",
            "w",
            "m",
            "clip_fraction",
            "grad_norm",
            "response_length_mean",
            "train_tokens",
            "quadrant/pos_high/fraction",
        ):
            assert on[key] == pytest.approx(off[key], rel=1e-5, abs=1e-7), (on["step"], key)
