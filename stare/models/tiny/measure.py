"""Build-time measurements of a tiny model on its task (build_info.json, the warm start's early
stop): greedy accuracy, sampling accuracy and entropy. Tool tasks run through the rollout's
`ToolAgent` (the one import of a role by the core: see pyproject's import-linter contract)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from stare.models.tiny.spec import EvalResult

if TYPE_CHECKING:  # heavy imports stay out of module import (the CLI's --help must be instant)
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from rollout.agent_loop import AgentCompletion
    from stare.data.tasks.base import Problem, Task
    from stare.sandbox import Sandbox


@runtime_checkable
class _ToolTask(Protocol):
    """A task whose completions call a tool (tool-arithmetic): its warm start answers the calls in memory."""

    def warm_start_sandbox(self) -> Sandbox: ...

    def reward(self, problem: Problem, completion: str) -> float: ...


def evaluate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    problems: Sequence[Problem],
    *,
    seed: int = 0,
    max_new_tokens: int = 40,
    batch_size: int = 256,
) -> EvalResult:
    """Greedy accuracy (overall and per level) and temperature-1.0 sampling statistics.

    Entropy is the policy's full next-token entropy H(pi(.|prefix)) at each sampled response
    position (the <eos> position included, padding after it excluded), averaged over tokens, as an
    RL loop with token-mean aggregation would log it. Sampling uses a forked RNG seeded with
    `seed`, so the caller's global RNG state is left untouched.
    """
    import torch

    if isinstance(task, _ToolTask):
        return _evaluate_with_tool(model, tokenizer, task, problems, seed=seed, max_new_tokens=max_new_tokens)
    greedy_hits = _greedy_rewards(model, tokenizer, task, problems, max_new_tokens, batch_size)
    sample_hits: list[float] = []
    ent_sum, tok_count = 0.0, 0
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(problems), batch_size):
            chunk = problems[start : start + batch_size]
            new, logits = _complete(model, tokenizer, chunk, max_new_tokens, sample=True)
            if logits is None:  # sample=True asks for them
                raise RuntimeError("generate returned no logits for a sampled batch")
            texts = tokenizer.batch_decode(new, skip_special_tokens=True)
            sample_hits += [task.reward(p, c) for p, c in zip(chunk, texts)]
            logp = torch.log_softmax(logits.float(), dim=-1)  # [B, T, V]
            ent = -(logp.exp() * logp).sum(-1)  # [B, T]
            mask = response_mask(new, tokenizer.eos_token_id)  # [B, T]
            ent_sum += float((ent * mask).sum())  # host sync: once per eval batch
            tok_count += int(mask.sum())
    return EvalResult(
        greedy_accuracy=_mean(greedy_hits),
        greedy_accuracy_by_level=_accuracy_by_level(problems, greedy_hits),
        sample_accuracy=_mean(sample_hits),
        sample_entropy=round(ent_sum / max(tok_count, 1), 4),
        mean_response_tokens=round(tok_count / max(len(problems), 1), 2),
        n=len(problems),
    )


def greedy_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    problems: Sequence[Problem],
    *,
    max_new_tokens: int = 40,
    batch_size: int = 256,
) -> float:
    """Mean reward of greedy completions of `problems`."""
    return _mean(_greedy_rewards(model, tokenizer, task, problems, max_new_tokens, batch_size))


def _greedy_rewards(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    problems: Sequence[Problem],
    max_new_tokens: int,
    batch_size: int,
) -> list[float]:
    if isinstance(task, _ToolTask):
        texts = [
            _text(tokenizer, c[0])
            for c in _agent_rollouts(
                model, tokenizer, task, problems, temperature=0.0, seed=0, max_new_tokens=max_new_tokens
            )
        ]
        return [task.reward(p, t) for p, t in zip(problems, texts)]
    hits: list[float] = []
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        new, _ = _complete(model, tokenizer, chunk, max_new_tokens, sample=False)
        texts = tokenizer.batch_decode(new, skip_special_tokens=True)
        hits += [task.reward(p, c) for p, c in zip(chunk, texts)]
    return hits


def _complete(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    max_new_tokens: int,
    *,
    sample: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Generated tokens [B, T] (eos, then pad) and, when sampling, their raw logits [B, T, V]."""
    import torch
    from transformers import GenerationMixin
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    enc = tokenizer(
        [p.prompt for p in problems],
        return_tensors="pt",
        padding=True,
        padding_side="left",
        add_special_tokens=False,
    )
    model.eval()
    if not isinstance(model, GenerationMixin):
        raise TypeError(f"{type(model).__name__} cannot generate (it is no transformers GenerationMixin)")
    with torch.no_grad():
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=sample,
            temperature=1.0 if sample else None,
            top_k=0 if sample else None,
            top_p=1.0 if sample else None,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            return_dict_in_generate=True,
            output_logits=sample,
        )
    if not isinstance(out, GenerateDecoderOnlyOutput):  # return_dict_in_generate, a causal LM
        raise TypeError(f"generate returned a {type(out).__name__}, not a decoder-only model's output")
    if sample and out.logits is None:
        raise RuntimeError("generate returned no logits although output_logits was set")
    new = out.sequences[:, enc["input_ids"].shape[1] :]  # [B, T]
    logits = torch.stack(out.logits, dim=1) if sample and out.logits is not None else None  # [B, T, V]
    return new, logits


def _agent_rollouts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: _ToolTask,
    problems: Sequence[Problem],
    *,
    temperature: float,
    seed: int,
    max_new_tokens: int,
) -> list[list[AgentCompletion]]:
    """One multi-turn completion per problem from the rollout's ToolAgent over a copy of `model`
    (HFEngine), tool calls answered by `task.warm_start_sandbox()`."""
    import tempfile

    from transformers.utils import logging as hf_logging

    from rollout.agent_loop import ToolAgent
    from rollout.engines.base import SamplingParams
    from rollout.engines.hf_engine import HFEngine

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no save/load progress bars at every warm-start check
    try:
        with tempfile.TemporaryDirectory(prefix="stare-tiny-eval-") as tmp:
            model.save_pretrained(tmp)
            engine = HFEngine(tmp)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    try:
        agent = ToolAgent(engine, tokenizer, task.warm_start_sandbox(), max_turns=2)
        prompts = [tokenizer.encode(p.prompt, add_special_tokens=False) for p in problems]
        return agent.generate(
            prompts,
            SamplingParams(
                n=1,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                seed=seed,
                stop_token_ids=(tokenizer.eos_token_id,),
            ),
        )
    finally:
        engine.close()


def _text(tokenizer: PreTrainedTokenizerBase, completion: AgentCompletion) -> str:
    text = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
    if not isinstance(text, str):  # one sequence decodes to one string
        raise TypeError(f"the tokenizer decoded one sequence to a {type(text).__name__}")
    return text


def _evaluate_with_tool(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: _ToolTask,
    problems: Sequence[Problem],
    *,
    seed: int,
    max_new_tokens: int,
) -> EvalResult:
    """`evaluate` for tool tasks. Entropy is estimated as the mean surprisal -log p of the sampled
    generated tokens (an unbiased estimate of the mean next-token entropy; the engine returns no
    full distributions); observation tokens are not counted."""
    greedy = [
        c[0]
        for c in _agent_rollouts(
            model, tokenizer, task, problems, temperature=0.0, seed=0, max_new_tokens=max_new_tokens
        )
    ]
    sampled = [
        c[0]
        for c in _agent_rollouts(
            model, tokenizer, task, problems, temperature=1.0, seed=seed, max_new_tokens=max_new_tokens
        )
    ]
    greedy_hits = [task.reward(p, _text(tokenizer, c)) for p, c in zip(problems, greedy)]
    sample_hits = [task.reward(p, _text(tokenizer, c)) for p, c in zip(problems, sampled)]
    surprisal = [-lp for c in sampled for lp, m in zip(c.logprobs, c.loss_mask) if m]
    return EvalResult(
        greedy_accuracy=_mean(greedy_hits),
        greedy_accuracy_by_level=_accuracy_by_level(problems, greedy_hits),
        sample_accuracy=_mean(sample_hits),
        sample_entropy=round(sum(surprisal) / max(len(surprisal), 1), 4),
        mean_response_tokens=round(len(surprisal) / max(len(problems), 1), 2),
        n=len(problems),
        tool_call_rate=_mean([float(c.turns > 1) for c in sampled]),
    )


def response_mask(new_tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1.0 on generated tokens up to and including the first eos, 0.0 after. [B, T] -> [B, T]."""
    is_eos = (new_tokens == eos_id).long()  # [B, T]
    before_or_at_first_eos = (is_eos.cumsum(dim=1) - is_eos) == 0  # [B, T]
    return before_or_at_first_eos.float()


def _accuracy_by_level(problems: Sequence[Problem], hits: list[float]) -> dict[int, float]:
    by_level: dict[int, list[float]] = {}
    for p, hit in zip(problems, hits):
        by_level.setdefault(p.level, []).append(hit)
    return {k: _mean(v) for k, v in sorted(by_level.items())}


def _mean(xs: Sequence[float]) -> float:
    return round(sum(xs) / len(xs), 4) if xs else 0.0
