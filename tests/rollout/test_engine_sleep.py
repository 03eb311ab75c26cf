"""The transformers engine's sleep and wake (SleepingEngine): asleep it holds no weight storage on its
device and refuses to sample or load weights; awake again it has its weights bit for bit and samples
what it sampled before. (vLLM's sleep mode is CUDA-only: rollout/engines/vllm_engine.py, not run here.)"""

from __future__ import annotations

import pytest
import torch

from rollout.engines.base import SamplingParams, SleepingEngine
from rollout.engines.hf_engine import HFEngine

PARAMS = SamplingParams(n=2, max_new_tokens=8, seed=7)
PROMPTS = [[5, 6, 7], [8, 9]]


@pytest.fixture
def engine(tiny_model_dir):
    return HFEngine(str(tiny_model_dir))


def _snapshot(engine: HFEngine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine._tensors().items()}


def test_the_hf_engine_is_a_sleeping_engine(engine):
    assert isinstance(engine, SleepingEngine) and engine.asleep is False


def test_asleep_the_engine_holds_no_weight_storage(engine):
    before = sum(t.numel() for t in engine._tensors().values())
    engine.sleep()
    assert engine.asleep and before > 0
    assert all(t.numel() == 0 for t in engine._tensors().values())  # every parameter and buffer released
    assert all(p.numel() == 0 for p in engine.model.parameters())


@pytest.mark.parametrize("call", ["generate", "add", "update_weights"])
def test_asleep_the_engine_refuses_work_and_says_wake(engine, call):
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    engine.sleep()
    args = {"generate": (PROMPTS, PARAMS), "add": (PROMPTS[0], PARAMS, "k"), "update_weights": (state, 1)}[call]
    with pytest.raises(RuntimeError, match=r"sleeping rollout engine: wake\(\) it first"):
        getattr(engine, call)(*args)
    assert engine.weight_version == 0


def test_wake_restores_every_weight_bit_for_bit_and_the_same_samples(engine):
    before, out = _snapshot(engine), engine.generate(PROMPTS, PARAMS)
    engine.sleep()
    engine.wake()
    after = engine._tensors()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    again = engine.generate(PROMPTS, PARAMS)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in out]
    assert [[c.logprobs for c in g] for g in again] == [[c.logprobs for c in g] for g in out]


def test_tied_weights_stay_tied_through_a_sleep(engine):
    model = engine.model
    if not model.config.tie_word_embeddings:
        pytest.skip("the tiny model does not tie its embeddings")
    engine.sleep()
    engine.wake()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight.numel() > 0


def test_new_weights_after_a_wake_are_the_ones_sampled_from(engine):
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    engine.sleep()
    engine.wake()
    engine.update_weights({k: torch.zeros_like(v) if k.endswith("norm.weight") else v for k, v in state.items()}, 3)
    assert engine.weight_version == 3
    norms = [p for n, p in engine.model.named_parameters() if n.endswith("norm.weight")]
    assert norms and all(bool((p == 0).all()) for p in norms)


def test_sleep_and_wake_are_idempotent(engine):
    before = _snapshot(engine)
    engine.wake()  # awake already: nothing happens
    engine.sleep()
    engine.sleep()  # asleep already: the host copies are not overwritten by the empty tensors
    engine.wake()
    assert all(torch.equal(engine._tensors()[k], before[k]) for k in before)


def test_sleep_refuses_while_prompts_are_queued(engine):
    engine.add(PROMPTS[0], PARAMS, "k")
    with pytest.raises(RuntimeError, match=r"queued for streaming; step\(\) them first"):
        engine.sleep()
    assert not engine.asleep
