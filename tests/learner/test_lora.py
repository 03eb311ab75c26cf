"""LoRA (model.lora, through peft) in the real learner (DeepSpeed on CPU): only the adapters train
and hold optimizer state, the merged weights are base + (alpha / r) B A and give the peft model's
forward, the HF rollout engine samples from them, checkpoints hold the adapters, and a run exports
merged weights or the adapter directory."""

import json
import math

import pytest
import torch

pytest.importorskip("peft")

from learner_helpers import save_random_qwen2, trajectories

from learner.engine.lora import merged_state_dict
from stare.config import ConfigError, build_config

LORA = ["model.lora.r=4", "model.lora.alpha=8"]
COMMON = [
    "rollout.prompts_per_step=3",
    "rollout.samples_per_prompt=4",
    "optim.micro_batch=12",
    "optim.lr=1e-2",
    "optim.zero_stage=0",
    "loss.name=grpo",
] + LORA


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_random_qwen2(tmp_path_factory.mktemp("model") / "m")


@pytest.fixture(scope="module")
def trained(model_dir):
    """A LoRA learner after two steps (lora_B starts at 0, so lora_A first moves in step 2)."""
    from learner.step.trainer import Learner

    learner = Learner(build_config({}, overrides=COMMON), model_dir, pad_id=0)
    before = {k: v.detach().clone() for k, v in learner.engine.module.named_parameters()}
    for seed in (0, 1):
        learner.train_step(trajectories(seed))
    return learner, before


def test_a_lora_step_changes_only_the_adapters_and_only_they_hold_optimizer_state(trained):
    learner, before = trained
    after = dict(learner.engine.module.named_parameters())
    adapters = {k for k in after if ".lora_" in k}
    assert adapters and {k for k, p in after.items() if p.requires_grad} == adapters
    for name, p in after.items():
        if name in adapters:
            assert not torch.equal(p.detach(), before[name]), name
        else:
            assert torch.equal(p.detach(), before[name]), name
    in_optimizer = {id(p) for g in learner.engine.optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(after[k]) for k in adapters}


def test_merged_weights_are_base_plus_scaled_adapter_and_give_the_peft_forward(trained, model_dir):
    from transformers import AutoModelForCausalLM

    learner, _ = trained
    merged = merged_state_dict(learner.engine.module)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    assert merged.keys() == base.state_dict().keys()
    params = dict(learner.engine.module.named_parameters())
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    a, b = params[f"{prefix}.lora_A.default.weight"], params[f"{prefix}.lora_B.default.weight"]  # [r, in], [out, r]
    by_hand = base.state_dict()["model.layers.0.self_attn.q_proj.weight"] + (8 / 4) * b.detach() @ a.detach()
    torch.testing.assert_close(merged["model.layers.0.self_attn.q_proj.weight"], by_hand, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        merged["model.embed_tokens.weight"], base.state_dict()["model.embed_tokens.weight"], rtol=0, atol=0
    )  # no adapter there: the base weight
    base.load_state_dict(merged)
    ids = torch.tensor([[5, 9, 17, 3, 44, 12, 70]])
    learner.engine.module.eval()
    with torch.no_grad():
        torch.testing.assert_close(base(ids).logits, learner.engine.module(input_ids=ids).logits, rtol=0, atol=1e-5)


def test_after_a_sync_the_hf_engine_samples_from_the_merged_policy(trained, model_dir):
    from rollout.engines.base import SamplingParams
    from rollout.engines.hf_engine import HFEngine

    learner, _ = trained
    engine = HFEngine(str(model_dir))
    engine.update_weights(learner.state_dict_for_rollout(), version=2)
    prompt = [5, 9, 17, 3]
    (samples,) = engine.generate([prompt], SamplingParams(n=4, max_new_tokens=8, seed=3))
    learner.engine.module.eval()
    gaps = []
    with torch.no_grad():
        for c in samples:
            ids = torch.tensor([prompt + c.token_ids])
            logp = torch.log_softmax(learner.engine.module(input_ids=ids).logits[0].double(), -1)
            mine = logp[len(prompt) - 1 : -1].gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
            gaps.append((mine - torch.tensor(c.logprobs, dtype=torch.float64)).abs().max())
    assert max(gaps) < 1e-3
    base = HFEngine(str(model_dir))  # the test can tell: the base policy's log-probs are farther off
    (base_samples,) = base.generate([prompt], SamplingParams(n=1, max_new_tokens=8, seed=3))
    with torch.no_grad():
        ids = torch.tensor([prompt + base_samples[0].token_ids])
        logp = torch.log_softmax(learner.engine.module(input_ids=ids).logits[0].double(), -1)
        mine = logp[len(prompt) - 1 : -1].gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
    assert (mine - torch.tensor(base_samples[0].logprobs, dtype=torch.float64)).abs().max() > 1e-2


def test_checkpoints_hold_the_adapters_and_restore_the_merged_weights(trained, model_dir, tmp_path):
    from learner.step.trainer import Learner

    learner, _ = trained
    tag = learner.save(tmp_path, {})
    module = torch.load(tmp_path / tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)["module"]
    assert module and all(".lora_" in k for k in module)
    assert json.loads((tmp_path / tag / "trainer_state.json").read_text())["lora"]["r"] == 4
    fresh = Learner(build_config({}, overrides=COMMON), model_dir, pad_id=0)
    fresh.load(tmp_path, tag)
    want, got = learner.state_dict_for_rollout(), fresh.state_dict_for_rollout()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=k)


def test_lora_refuses_zero3():
    with pytest.raises(ConfigError, match="zero_stage"):
        build_config({}, overrides=LORA + ["optim.zero_stage=3"])


@pytest.mark.slow
@pytest.mark.parametrize("export", ["merged", "adapter"])
def test_an_embedded_run_with_lora_trains_and_exports(tmp_path, export):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from stare.app.launch.embedded import run_training
    from stare.app.launch.run_folder import prepare_run

    cfg = build_config(
        {
            "run": {"name": "lora", "output_dir": str(tmp_path), "steps": 2, "checkpoint_every": 10, "threads": 1},
            "rollout": {"prompts_per_step": 4, "samples_per_prompt": 4, "max_new_tokens": 8},
            "task": {"eval_problems": 2, "eval_every": 1000},
            "optim": {"lr": 1e-2, "micro_batch": 16},
            "model": {"lora": {"r": 4, "alpha": 8, "export": export}},
            "control_plane": {"serve_in_train": False},
        }
    )
    run = prepare_run(cfg, None)
    run_dir = run_training(run, progress=False)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(math.isfinite(m["loss"]) for m in metrics)
    hf = run_dir / "hf"
    info = json.loads((hf / "export_info.json").read_text())
    assert info["lora"]["export"] == export
    base = AutoModelForCausalLM.from_pretrained(info["base_model"]).state_dict()
    if export == "merged":
        weights = load_file(hf / "model.safetensors")
        assert weights.keys() == base.keys() - {"lm_head.weight"} or weights.keys() == base.keys()
        moved = [k for k in weights if not torch.equal(weights[k], base[k])]
        assert moved and all("proj" in k for k in moved)  # only the adapted linears moved
    else:
        adapter = load_file(hf / "adapter_model.safetensors")
        assert adapter and all("lora_" in k for k in adapter)
        assert json.loads((hf / "adapter_config.json").read_text())["r"] == 4
