"""Rollout correction (loss.rollout_correction) against hand-derived values on a small batch: each
truncated and masked IS variant, the mismatch KLs, the legacy loss.tis_cap, and the real learner's
step with the correction (its metrics and the tokens it trains)."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from learner_helpers import save_random_qwen2, trajectories

from learner.algorithm.rollout_correction import METRIC_SUMS, correction_metrics, rollout_correction
from stare.config import ConfigError, build_config
from stare.config.algo import GrpoLossConfig, RolloutCorrectionConfig

D = torch.float64
# rho = pi_learner / pi_rollout per token; row 1's last token is not a loss token (its rho 4 is ignored)
RHO = torch.tensor([[2.0, 0.5, 1.0], [1.5, 1.0, 4.0]], dtype=D)
MASK = torch.tensor([[True, True, True], [True, True, False]])
OLD = torch.log(torch.tensor([[0.5, 0.1, 0.3], [0.6, 0.2, 0.8]], dtype=D))
ROLLOUT = OLD - RHO.log()


def _run(**cfg):
    return rollout_correction(OLD, ROLLOUT, MASK, RolloutCorrectionConfig(**cfg))


def _sums(corr):
    return dict(zip(METRIC_SUMS, corr.sums.tolist()))


def test_token_tis_caps_each_token():
    corr = _run(is_level="token", is_cap=1.8)
    torch.testing.assert_close(corr.weight[MASK], torch.tensor([1.8, 0.5, 1.0, 1.5, 1.0], dtype=D), rtol=0, atol=1e-12)
    assert torch.equal(corr.keep, MASK)  # truncation drops nothing
    assert _sums(corr)["truncated_tokens"] == 1  # rho 2 > 1.8


def test_sequence_tis_weights_every_token_by_the_capped_product():
    # row 0: 2 x 0.5 x 1 = 1; row 1: 1.5 x 1 = 1.5 (the unmasked rho 4 is not in the product)
    corr = _run(is_level="sequence", is_cap=2.0)
    torch.testing.assert_close(corr.weight[MASK], torch.tensor([1.0, 1.0, 1.0, 1.5, 1.5], dtype=D), rtol=0, atol=1e-12)
    assert _sums(corr)["truncated_tokens"] == 0
    capped = _run(is_level="sequence", is_cap=1.2)
    torch.testing.assert_close(
        capped.weight[MASK], torch.tensor([1.0, 1.0, 1.0, 1.2, 1.2], dtype=D), rtol=0, atol=1e-12
    )
    assert _sums(capped)["truncated_tokens"] == 2  # both tokens of row 1


def test_token_mask_drops_tokens_outside_the_thresholds():
    corr = _run(mask_level="token", mask_low=0.6, mask_high=1.9)  # rho 2 > 1.9 and 0.5 < 0.6 go
    expected = torch.tensor([[False, False, True], [True, True, False]])
    assert torch.equal(corr.keep, expected) and corr.weight is None
    assert _sums(corr)["masked_tokens"] == 2
    default_low = _run(mask_level="token", mask_high=1.9)  # low = 1 / 1.9 = 0.526: 0.5 still goes
    assert torch.equal(default_low.keep, expected)


def test_sequence_mask_drops_whole_sequences_by_the_product():
    corr = _run(mask_level="sequence", mask_high=1.4)  # row 0: 1 stays; row 1: 1.5 > 1.4 goes
    assert torch.equal(corr.keep, torch.tensor([[True, True, True], [False, False, False]]))
    assert _sums(corr)["masked_tokens"] == 2


def test_geometric_mask_uses_the_per_token_mean():
    # row 1's geometric mean is sqrt(1.5) = 1.2247: out of [1/1.2, 1.2], inside [1/1.25, 1.25];
    # row 0's is (2 x 0.5 x 1)^(1/3) = 1 either way
    tight = _run(mask_level="geometric", mask_high=1.2)
    assert torch.equal(tight.keep, torch.tensor([[True, True, True], [False, False, False]]))
    loose = _run(mask_level="geometric", mask_high=1.25)
    assert torch.equal(loose.keep, MASK)


def test_mask_and_truncation_compose():
    corr = _run(is_level="token", is_cap=1.8, mask_level="token", mask_low=0.6, mask_high=3.0)  # 0.5 goes, 2 -> 1.8
    assert torch.equal(corr.keep, torch.tensor([[True, False, True], [True, True, False]]))
    m = correction_metrics(corr.sums.tolist())
    assert m["rollout_is_weight_mean"] == pytest.approx((1.8 + 1.0 + 1.5 + 1.0) / 4, abs=1e-12)  # the kept tokens
    assert m["rollout_masked_fraction"] == pytest.approx(1 / 5) and m["rollout_truncated_fraction"] == pytest.approx(
        1 / 5
    )


def test_mismatch_kls_k1_and_k3():
    m = correction_metrics(_run().sums.tolist())
    logs = [math.log(2.0), math.log(0.5), 0.0, math.log(1.5), 0.0]
    rhos = [2.0, 0.5, 1.0, 1.5, 1.0]
    assert m["rollout_mismatch_k1"] == pytest.approx(-sum(logs) / 5, abs=1e-12)  # -ln 1.5 / 5
    assert m["rollout_mismatch_k3"] == pytest.approx(sum(r - 1 - lg for r, lg in zip(rhos, logs)) / 5, abs=1e-12)
    assert m["rollout_masked_fraction"] == 0.0 and m["rollout_is_weight_mean"] == 1.0


def test_no_correction_leaves_the_mask_and_no_weight():
    corr = _run()
    assert corr.weight is None and corr.keep is MASK


def test_legacy_tis_cap_reads_as_token_tis_with_a_warning():
    with pytest.warns(FutureWarning, match="tis_cap is deprecated"):
        cfg = GrpoLossConfig(tis_cap=1.5)
    assert cfg.rollout_correction == RolloutCorrectionConfig(is_level="token", is_cap=1.5)
    with pytest.warns(FutureWarning):
        assert (
            build_config({"loss": {"name": "stare", "tis_cap": 2.0}}, algo="grpo").loss.rollout_correction.is_cap == 2.0
        )
    with pytest.raises(ConfigError, match="tis_cap"):
        build_config({"loss": {"tis_cap": 2.0, "rollout_correction": {"is_level": "sequence"}}})
    with pytest.raises(ConfigError, match="rollout_correction"):
        build_config({"system": {"stale_policy": "importance"}})
    assert build_config(
        {
            "system": {"stale_policy": "importance"},
            "loss": {"rollout_correction": {"mask_level": "geometric", "mask_high": 1.01}},
        }
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_qwen2(tmp_path_factory.mktemp("model") / "m")


def _learner_logprobs(model_dir, trajs):
    """Each response token's log-prob under the saved model (an independent plain forward)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    out = []
    with torch.no_grad():
        for t in trajs:
            ids = torch.tensor(np.concatenate([t.prompt_token_ids, t.response_token_ids]), dtype=torch.long)[None]
            logp = torch.log_softmax(model(ids).logits[0].double(), -1)
            p = len(t.prompt_token_ids)
            out.append(logp[p - 1 : -1].gather(-1, ids[0, p:, None]).squeeze(-1))
    return out


def test_the_learner_step_masks_and_reports_the_mismatch(model_dir):
    from learner.step.trainer import Learner

    trajs = trajectories(0, groups=3)
    # the rollout log-prob of token j of trajectory i: the learner's minus offset 0.3 on every third
    # token, 0 elsewhere, so rho = e^0.3 = 1.35 there; a token mask at 1.2 drops exactly those
    for i, (t, lp) in enumerate(zip(trajs, _learner_logprobs(model_dir, trajs))):
        offset = np.where(np.arange(len(lp)) % 3 == 0, 0.3, 0.0)
        trajs[i] = dataclasses.replace(t, response_logprobs=(lp.numpy() - offset).astype(np.float32))
    loss_tokens = [np.flatnonzero(t.loss_mask) for t in trajs]
    n = sum(len(k) for k in loss_tokens)
    n_off = sum(int((k % 3 == 0).sum()) for k in loss_tokens)
    learner = Learner(
        build_config(
            {},
            overrides=[
                "rollout.prompts_per_step=3",
                "rollout.samples_per_prompt=4",
                "optim.micro_batch=12",
                "loss.name=grpo",
                "loss.rollout_correction.mask_level=token",
                "loss.rollout_correction.mask_high=1.2",
            ],
        ),
        model_dir,
        pad_id=0,
    )
    m = learner.train_step(trajs)
    assert m["rollout_masked_fraction"] == pytest.approx(n_off / n, abs=1e-9)
    assert m["train_tokens"] == n - n_off  # the masked tokens leave the loss and its token count
    assert m["rollout_mismatch_k1"] == pytest.approx(-0.3 * n_off / n, abs=1e-5)
    assert m["rollout_mismatch_k3"] == pytest.approx((math.exp(0.3) - 1 - 0.3) * n_off / n, abs=1e-5)
    assert m["rollout_truncated_fraction"] == 0.0
