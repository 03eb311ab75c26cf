"""The output head under ZeRO-3 (learner.step.logprobs.ChunkedHead): gathered once per micro-batch
(not once per chunk), the decoder called without it, the same module calls every forward, and the
same losses, gradients and weights as ZeRO-1 (one rank, gloo, CPU)."""

import pytest
import torch
from learner_helpers import save_random_qwen2, trajectories

from stare.config import build_config

# chunk 4 with responses of up to 20 tokens: several chunks per micro-batch, differing between them
OVERRIDES = [
    "rollout.prompts_per_step=3",
    "rollout.samples_per_prompt=4",
    "optim.micro_batch=4",
    "optim.lr=1e-3",
    "optim.grad_clip=1000",
    "controller.target=10",
    "optim.logits_chunk_tokens=4",
]
COMPARED = ("loss", "entropy", "grad_norm", "clip_fraction", "train_tokens")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_qwen2(tmp_path_factory.mktemp("model") / "m")


def _learner(model_dir, stage: int):
    from learner.step.trainer import Learner

    return Learner(build_config({}, overrides=OVERRIDES + [f"optim.zero_stage={stage}"]), model_dir, pad_id=0)


def _count_gathers(model, param) -> dict[str, int]:
    """Counts DeepSpeed's all-gathers that include `param`: every ZeRO-3 parameter's
    `all_gather_coalesced` (the coordinator calls it on the first of each group it fetches) is wrapped
    by a counter that then calls the real gather."""
    count = {"gathers": 0}
    for p in model.parameters():
        real = p.all_gather_coalesced

        def counted(params, *args, _real=real, **kwargs):
            count["gathers"] += any(q is param for q in params)
            return _real(params, *args, **kwargs)

        p.all_gather_coalesced = counted
    return count


@pytest.mark.slow
def test_zero3_steps_equal_zero1_steps_losses_gradients_and_weights(model_dir):
    results = {}
    for stage in (1, 3):
        learner = _learner(model_dir, stage)
        metrics = [learner.train_step(trajectories(i)) for i in range(2)]
        results[stage] = metrics, learner.state_dict_for_rollout()
    (m1, s1), (m3, s3) = results[1], results[3]
    for step, (a, b) in enumerate(zip(m1, m3)):
        for key in COMPARED:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (step, key)
    assert s1.keys() == s3.keys()
    for name in s1:  # after two Adam steps at lr 1e-3: equal updates, hence equal gradients
        torch.testing.assert_close(s3[name], s1[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.slow
def test_zero3_gathers_the_head_once_per_micro_batch_and_every_forward_calls_the_same_modules(model_dir, monkeypatch):
    from learner.engine import deepspeed_engine as ds

    real_config = ds.deepspeed_config

    def eager_release(**kwargs):  # as a 7B model runs: no parameter persists, none is kept for reuse
        config = real_config(**kwargs)
        config["zero_optimization"].update(
            stage3_param_persistence_threshold=0, stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0
        )
        return config

    monkeypatch.setattr(ds, "deepspeed_config", eager_release)
    learner = _learner(model_dir, 3)
    model = learner.engine.module
    forwards: list[list[str]] = []  # module names called, one list per root forward
    calls = {"stare_head": 0, "lm_head": 0}
    names = {id(m): n for n, m in model.named_modules()}

    def pre(module, _args):
        name = names[id(module)]
        if name == "":
            forwards.append([])
        elif torch.is_grad_enabled() or not module.training:  # not a checkpoint's recompute
            forwards[-1].append(name) if forwards else None
        if name in calls:
            calls[name] += 1

    for m in model.modules():
        m.register_forward_pre_hook(pre)
    trajs = trajectories(0)
    updates = learner._collate(trajs).updates
    (mbs,) = updates  # one update per batch (optim.mini_batches 1)
    chunks = [-(-mb.targets.shape[0] // 4) for mb in mbs]
    assert len(set(chunks)) > 1 and max(chunks) > 1  # the micro-batches differ in their chunk counts
    gathers = _count_gathers(model, model.lm_head.weight)
    learner.train_step(trajs)
    n = len(mbs)
    # pre-pass and train pass: one head call per micro-batch each, never the model's own head module
    assert calls == {"stare_head": 2 * n, "lm_head": 0}
    # one gather per call in the forward and one for its backward (not one per chunk: sum(chunks) x 3)
    assert gathers["gathers"] == 2 * n + n
    assert len(forwards) == 2 * n
    heads = [f[-1] for f in forwards]
    assert heads == ["stare_head"] * (2 * n)  # the head is called after the decoder, in every forward
    assert all(f == forwards[0] for f in forwards)  # the same module sequence: a stable prefetch trace
