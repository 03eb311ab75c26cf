"""Builders shared by the learner tests (not a test module): a small random causal LM on disk and
scored trajectories with long-tailed lengths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from stare.records import Trajectory

VOCAB = 97


def random_qwen2(seed: int = 0, vocab: int = VOCAB, hidden: int = 32, layers: int = 2, dtype=torch.float32):
    """A randomly initialised Qwen2 causal LM (sdpa attention), small enough for a CPU test."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=2 * hidden, max_position_embeddings=256,
                         tie_word_embeddings=False, initializer_range=0.2, pad_token_id=0, eos_token_id=1,
                         attn_implementation="sdpa")
    return Qwen2ForCausalLM(config).to(dtype)


def save_random_qwen2(path: Path, seed: int = 0) -> Path:
    random_qwen2(seed).save_pretrained(path)
    return path


def trajectories(seed: int, groups: int = 3, group_size: int = 4, max_prompt: int = 6, max_response: int = 20,
                 first_tokens: tuple[int, ...] | None = None) -> list[Trajectory]:
    """Scored trajectories: mixed rewards inside each group, lengths drawn from a long tail."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        for s in range(group_size):
            p = int(rng.integers(1, max_prompt + 1))
            r = int(min(max_response, 1 + rng.pareto(1.2) * 3))
            response = rng.integers(2, VOCAB, r).astype(np.int32)
            if first_tokens is not None:
                response[0] = first_tokens[len(out) % len(first_tokens)]
            mask = np.ones(r, dtype=np.uint8)
            if r > 3:
                mask[1] = 0  # a tool-output token: masked out of the loss
            out.append(Trajectory(
                run_id="t", trajectory_id=f"{seed}-{g}-{s}", group_id=f"{seed}-{g}", group_size=group_size,
                weight_version=0, prompt_token_ids=rng.integers(2, VOCAB, p).astype(np.int32),
                response_token_ids=response, response_logprobs=-rng.random(r).astype(np.float32) * 3,
                loss_mask=mask, finish_reason="stop", answer="", problem_id=str(g), data_source="t",
                reward=float((s + g) % 2 if s < group_size - 1 else rng.random()),
            ))
    return out
