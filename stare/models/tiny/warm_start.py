"""A fresh tiny Qwen2 and its supervised warm start on reference solutions (stopped early on
accuracy, so the model is only partly trained)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stare.models.tiny.measure import greedy_accuracy
from stare.models.tiny.spec import TinyModelSpec

if TYPE_CHECKING:  # heavy imports stay out of module import (the CLI's --help must be instant)
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from stare.data.tasks.base import Problem, SupervisedTask


def _new_model(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        initializer_range=spec.init_std,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=40,
    )
    return model


def _sft_batch(
    tokenizer: PreTrainedTokenizerBase,
    task: SupervisedTask,
    problems: Sequence[Problem],
    rng: random.Random | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded prompt+solution+eos ids, attention mask, and labels (-100 off the completion
    and, for multi-turn tasks, off the untrained segments such as tool observations)."""
    import torch

    def encode(texts: list[str]) -> list[list[int]]:  # one call into the Rust tokenizer
        return tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []

    prompts = encode([p.prompt for p in problems])
    if hasattr(task, "solution_segments"):
        completions, trained_labels = [], []
        for p in problems:
            completion: list[int] = []
            label: list[int] = []
            for text, trained in task.solution_segments(p, rng):
                ids = tokenizer.encode(text, add_special_tokens=False)
                completion += ids
                label += ids if trained else [-100] * len(ids)
            completions.append(completion)
            trained_labels.append(label)
    else:
        completions = encode([task.solution(p, rng) for p in problems])
        trained_labels = completions
    eos = tokenizer.eos_token_id
    rows = [prompt + completion + [eos] for prompt, completion in zip(prompts, completions)]
    labels = [[-100] * len(prompt) + label + [eos] for prompt, label in zip(prompts, trained_labels)]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])  # [B, L]
    lab = torch.tensor([y + [-100] * (width - len(y)) for y in labels])  # [B, L]
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])  # [B, L]
    return ids, mask, lab


def _warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: SupervisedTask,
    train: Sequence[Problem],
    val: Sequence[Problem],
    spec: TinyModelSpec,
    *,
    verbose: bool,
) -> dict[str, Any]:
    """Supervised warm start on reference solutions (with random equally-correct variants).

    AdamW, linear warmup then constant LR, each problem seen once; stops early once greedy
    accuracy on `val` reaches the target (checked every `sft_check_every` steps). Returns the
    number of steps taken and a (step, loss, val accuracy) history.
    """
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=spec.sft_lr, weight_decay=0.0)
    warmup = max(1, spec.sft_warmup_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warmup))
    variants = random.Random(f"sft-variants/{spec.seed}")
    history: list[dict[str, float]] = []
    steps = 0
    for step in range(spec.sft_max_steps):
        model.train()
        chunk = train[step * spec.sft_batch_size : (step + 1) * spec.sft_batch_size]
        # One micro-batch per level: lengths differ by level, so this pads far less (~1/3 less
        # compute) than one batch padded to the longest row. Same gradient as one big batch.
        micro = [
            _sft_batch(tokenizer, task, [p for p in chunk if p.level == level], variants)
            for level in sorted({p.level for p in chunk})
        ]
        num_tokens = sum(int((labels != -100).sum()) for _, _, labels in micro)
        opt.zero_grad(set_to_none=True)
        step_loss = torch.zeros(())
        for ids, mask, labels in micro:
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]  # [B, L-1, V]
            loss = (
                torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]),
                    labels[:, 1:].reshape(-1),
                    ignore_index=-100,
                    reduction="sum",
                )
                / num_tokens
            )
            loss.backward()
            step_loss += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        steps = step + 1
        if steps % spec.sft_check_every == 0 or steps == spec.sft_max_steps:
            acc = greedy_accuracy(model, tokenizer, task, val)
            # host sync: once per check, off the hot path
            history.append({"step": steps, "loss": round(float(step_loss), 4), "val_greedy": acc})
            if verbose:
                print(f"sft step {steps} loss {history[-1]['loss']} val greedy accuracy {acc}")
            if acc >= spec.sft_target_accuracy:
                break
    model.eval()
    return {"steps": steps, "history": history}
