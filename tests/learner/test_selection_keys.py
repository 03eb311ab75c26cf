"""STARE's selection keyed on the rollout's log-probs (`loss.selection_keys: rollout`,
learner/step/trainer.py): the step runs no pre-pass once an entropy is lagged, takes the old log-probs
from its own forward, ranks surprisal by the rollout's log-probs, and computes the rollout correction
per micro-batch. Against the learner-keyed step (the pre-pass; both gates read the lagged entropy):
with the rollout's keys equal to the learner's the two steps are the same within fp32 rounding.
Real DeepSpeed on CPU, fp32, ZeRO-0."""

import dataclasses

import numpy as np
import pytest
import torch
from learner_helpers import SMALL_STEP, build_learner, flat_weights, save_random_qwen2, trajectories

from stare.config import build_config

COMMON = [
    *SMALL_STEP,
    "controller.entropy_source=lagged",
    "diagnostics.predicted_entropy_change=false",
    "controller.w=1.5",
    "controller.w_max=1.5",
    "loss.variant=C2",
    "loss.top_fraction=0.3",
]
ROLLOUT = ["loss.selection_keys=rollout"]
ALWAYS_ON = ["controller.target=10"]  # the gate is on every step: the selection counts
NEVER_ON = ["controller.target=1e-6"]  # the gate is off every step: omega = 1, the selection does not count
COMPARED = ("loss", "entropy", "gate", "clip_fraction", "omega_sum", "train_tokens", "rollout_mismatch_k3")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_qwen2(tmp_path_factory.mktemp("model") / "m")


def _learner(model_dir, extra=()):
    return build_learner(model_dir, COMMON + list(extra))


def _with_logprobs(learner, trajs, noise: float = 0.0, seed: int = 0):
    """The trajectories with the learner's own log-probs at its current weights as the rollout's
    (plus `noise` nats of uniform noise): what an engine with the learner's weights would record."""
    old = learner.prepass_values(trajs)
    rng = np.random.default_rng(seed)
    out = []
    for t in trajs:
        lp = old[t.trajectory_id][0].numpy().astype(np.float32)
        lp = lp - noise * rng.random(lp.shape).astype(np.float32)
        out.append(dataclasses.replace(t, response_logprobs=lp))
    return out


def _two_steps(learner, keyed_by, noise=0.0):
    """Two steps; each step's rollout log-probs are `keyed_by`'s own at its weights before the step."""
    metrics = []
    for seed in (0, 1):
        metrics.append(learner.train_step(_with_logprobs(keyed_by, trajectories(seed), noise, seed)))
    return metrics


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("optim.mini_batches=3", "optim.mini_batches"),
        ("optim.epochs=2", "optim.epochs"),
        ("controller.entropy_source=prepass", "controller.entropy_source"),
        ("diagnostics.predicted_entropy_change=true", "diagnostics.predicted_entropy_change"),
        ("loss.rollout_correction.mask_level=token", "loss.rollout_correction.mask_level"),
        ("rollout.temperature=0.7", "rollout.temperature"),
        ("rollout.top_p=0.9", "rollout.top_p"),
    ],
)
def test_a_setting_that_needs_the_pre_pass_is_refused_by_name(override, field):
    with pytest.raises(ValueError) as err:
        build_config({}, overrides=COMMON + ROLLOUT + [override])
    assert f"set {field}=" in str(err.value) and "or loss.selection_keys=learner" in str(err.value)


def test_every_setting_in_the_way_is_named_at_once():
    with pytest.raises(ValueError) as err:
        build_config({}, overrides=ROLLOUT)  # the defaults: the pre-pass's entropy and its dH diagnostic
    assert "controller.entropy_source=lagged" in str(err.value)
    assert "diagnostics.predicted_entropy_change=false" in str(err.value)


def test_keys_from_a_rollout_with_the_learners_weights_give_the_learner_keyed_steps(model_dir):
    exact, keyed = _learner(model_dir, ALWAYS_ON), _learner(model_dir, ALWAYS_ON + ROLLOUT)
    for step in (0, 1):
        trajs = _with_logprobs(exact, trajectories(step), seed=step)  # both learners hold the same weights
        want, got = exact.train_step(trajs), keyed.train_step(trajs)
        assert want["gate"] == 1 and want["omega_sum"] > want["train_tokens"]  # the reweighting counts
        for key in COMPARED:
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), (step, key)
        torch.testing.assert_close(flat_weights(keyed), flat_weights(exact), rtol=0, atol=1e-6)
    assert want["prepass"] == 1 and got["prepass"] == 0 and got["prepass_micro_batches"] == 0  # step 2: none


def test_the_first_step_runs_the_pre_pass_for_the_gate(model_dir):
    keyed = _learner(model_dir, ALWAYS_ON + ROLLOUT)
    assert keyed.needs_prepass  # nothing lagged yet
    metrics = keyed.train_step(_with_logprobs(keyed, trajectories(0)))
    assert metrics["prepass"] == 1 and metrics["prepass_micro_batches"] > 0
    assert not keyed.needs_prepass


def test_the_selection_reads_the_rollouts_keys(model_dir):
    """Keys 0.5 nats off the learner's (uniform noise): other tokens are selected, so another step."""
    exact, keyed = _learner(model_dir, ALWAYS_ON), _learner(model_dir, ALWAYS_ON + ROLLOUT)
    trajs = _with_logprobs(exact, trajectories(0))
    exact.train_step(trajs)
    keyed.train_step(trajs)  # the same first step: the same weights
    noisy = _with_logprobs(exact, trajectories(1), noise=0.5, seed=1)
    want, got = exact.train_step(noisy), keyed.train_step(noisy)
    assert got["critical_pos_tokens"] == want["critical_pos_tokens"]  # the same count (top 30% of each sign)
    assert (flat_weights(keyed) - flat_weights(exact)).abs().max() > 1e-4


def test_the_rollout_correction_per_micro_batch_is_the_step_level_one(model_dir):
    """Truncated IS against noisy rollout log-probs, the gate off (the keys do not count): the IS
    weights and mismatch sums computed per micro-batch equal the step-level ones."""
    tis = ["loss.rollout_correction.is_level=token", "loss.rollout_correction.is_cap=1.2"]
    exact, keyed = _learner(model_dir, NEVER_ON + tis), _learner(model_dir, NEVER_ON + tis + ROLLOUT)
    for step in (0, 1):
        trajs = _with_logprobs(exact, trajectories(step), noise=0.5, seed=step)
        want, got = exact.train_step(trajs), keyed.train_step(trajs)
        assert want["gate"] == 0 and 0 < want["rollout_truncated_fraction"] < 1
        for key in (*COMPARED, "rollout_mismatch_k1", "rollout_truncated_fraction", "rollout_is_weight_mean"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), (step, key)
        torch.testing.assert_close(flat_weights(keyed), flat_weights(exact), rtol=0, atol=1e-6)
    assert got["prepass"] == 0


@pytest.mark.slow
def test_the_session_prepares_ahead_only_while_a_step_still_needs_its_pre_pass(fast_overrides):
    """stare train (embedded, the real session) with optim.prepass_early: as in test_prepare, the step
    waits with 2 groups ready each step; keyed on the rollout, only the first step (nothing lagged yet)
    has a pre-pass to run, so only it is prepared ahead."""
    import json

    from stare.app.launch.embedded import run_training
    from stare.app.launch.run_folder import prepare_run

    overrides = fast_overrides + [
        "run.steps=3",
        "run.name=keys-early",
        "data.oversample=2.0",
        "optim.prepass_early=true",
        *COMMON[len(SMALL_STEP) :],  # the gate on the lagged entropy, no dH, C2 at W 1.5 on the top 30%
        *ROLLOUT,
    ]
    run_dir = run_training(prepare_run(build_config({}, overrides=overrides), None), progress=False)
    lines = [json.loads(s) for s in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["prepass"] for m in lines] == [1, 0, 0]
    assert [m["prepared_groups"] for m in lines] == [2, 0, 0]
