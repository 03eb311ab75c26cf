"""Build the tiny Qwen2 policy and tokenizer for the embedded CPU demo (`stare train`).

`build_tiny_model` makes, from nothing but a seed and the bundled task, a standard Hugging Face
model directory that everything downstream loads by path, exactly like a real checkpoint:

    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)

Steps: (a) a character-level tokenizer over the task's alphabet plus <pad>, <eos>, <unk>;
(b) a small Qwen2 (2 layers, hidden 128, 0.3M parameters by default, fp32); (c) a supervised warm
start on reference solutions (with randomly drawn, equally correct variants), stopped as soon as
greedy accuracy on train-split problems reaches a target (0.45), so the model has only partly
learned the task: held-out greedy accuracy stays well inside (0, 1) and sampling at temperature
1.0 keeps real entropy (the room that GRPO collapses and STARE is meant to hold); (d)
`save_pretrained` of both, plus `build_info.json` with the arguments, their hash and measured
accuracy and entropy. About a minute on one core; see docs/tiny-model.md for measurements.

Prompt format: the problem's prompt text, tokenized as is (no BOS, no chat template); the
completion follows directly and ends with <eos>.

Multi-turn tasks (tool use): a task with `solution_segments(problem, rng) -> [(text, trained)]`
has its untrained parts (tool observations) masked out of the warm-start loss, as RL masks them;
a task with `whole_tokens` gets those strings as single tokens (tags, fixed JSON heads); a task
with `warm_start_sandbox()` is evaluated through the rollout's `ToolAgent` (HFEngine on a copy of
the weights, tool calls answered by that sandbox), since its answers need the tool's output.

The saved tokenizer pads on the left (for batched generation); `generation_config.json` carries
the eos and pad ids so `generate` stops at <eos>.

Determinism: the build runs on one thread with seeded RNGs, so the same arguments give the same
weights bit for bit on the same torch build. A directory whose `build_info.json` has the same
arguments hash is reused without retraining.

Not covered: anything beyond the toy regime (no BPE merges, no chat format, no GPU path).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # heavy imports stay out of module import (the CLI's --help must be instant)
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from stare.tasks.base import Problem, SupervisedTask, Task

BUILD_VERSION = 1
"""Bumped whenever the build procedure changes, so stale caches are rebuilt."""

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


@dataclasses.dataclass(frozen=True)
class TinyModelSpec:
    """Everything that determines a tiny-model build; hashed (with BUILD_VERSION) into the cache key.

    The warm start stops early, at the first check where greedy accuracy on `n_val` train-split
    problems reaches `sft_target_accuracy`, or after `sft_max_steps`. Stopping on accuracy rather
    than on a step count keeps the result in the partially-learned regime whatever the seed (the
    accuracy climbs steeply once the model starts to learn; where it starts varies by seed).
    """

    task_name: str = "arithmetic"
    seed: int = 0
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_positions: int = 128
    init_std: float = 0.02
    sft_max_steps: int = 600
    sft_batch_size: int = 64
    sft_lr: float = 3e-3
    sft_warmup_steps: int = 30
    sft_target_accuracy: float = 0.45  # > 1.0 disables early stopping
    sft_check_every: int = 25
    n_val: int = 128  # train-split problems for the early-stopping check
    n_eval: int = 400  # held-out (test-split) problems for the numbers in build_info.json

    def __post_init__(self) -> None:
        positive = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                    "max_positions", "sft_batch_size", "sft_check_every", "n_val", "n_eval")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.sft_max_steps < 0 or self.sft_warmup_steps < 0:
            raise ValueError("sft_max_steps and sft_warmup_steps must be >= 0")
        if self.sft_lr <= 0:
            raise ValueError(f"sft_lr must be > 0, got {self.sft_lr}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                "hidden_size must be divisible by num_heads, and num_heads by num_kv_heads; got "
                f"{self.hidden_size}, {self.num_heads}, {self.num_kv_heads}"
            )

    def args_hash(self) -> str:
        payload = {"version": BUILD_VERSION, **dataclasses.asdict(self)}
        task_version = _task_build_version(self.task_name)
        if task_version is not None:  # tasks without one (arithmetic) keep their original hash
            payload["task_build_version"] = task_version
        blob = json.dumps(payload, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _task_build_version(task_name: str) -> int | None:
    """The task's `build_version` (bumped when its solutions or format change), if it has one."""
    from stare.tasks.base import TASKS

    factory = TASKS.get(task_name)
    try:
        return None if factory is None else getattr(factory(), "build_version", None)
    except TypeError:  # a task that needs arguments (dataset) has no tiny-model build anyway
        return None


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """Held-out measurements of a policy on a task."""

    greedy_accuracy: float
    greedy_accuracy_by_level: dict[int, float]
    sample_accuracy: float  # temperature 1.0, one sample per problem
    sample_entropy: float  # mean next-token entropy (nats) over sampled response tokens, eos incl.
    mean_response_tokens: float  # sampled, eos included (generated tokens only for tool tasks)
    n: int
    tool_call_rate: float | None = None  # tool tasks: share of sampled responses that ran a tool call


def default_cache_dir() -> Path:
    """`$STARE_CACHE_DIR/models`, or `~/.cache/stare/models` when the variable is unset."""
    from stare.paths import cache_dir

    return cache_dir() / "models"


def default_model_dir(spec: TinyModelSpec) -> Path:
    """Where `build_tiny_model` puts `spec` when no directory is given."""
    return default_cache_dir() / f"tiny-{spec.task_name}-{spec.args_hash()[:8]}"


def build_tiny_model(
    out_dir: Path | str | None = None,
    task_name: str = "arithmetic",
    seed: int = 0,
    *,
    force: bool = False,
    verbose: bool = False,
    **spec_overrides: Any,
) -> Path:
    """Build (or reuse) the tiny model directory and return its path.

    `spec_overrides` are `TinyModelSpec` fields (e.g. `sft_max_steps=30, sft_target_accuracy=2.0`
    for a quick test build that learns next to nothing). `out_dir` defaults to `default_model_dir(spec)`. An existing directory is reused
    when its `build_info.json` has the same arguments hash (unless `force`); one with a different
    hash is rebuilt; a non-empty directory without `build_info.json` is refused rather than
    overwritten.
    """
    spec = TinyModelSpec(task_name=task_name, seed=seed, **spec_overrides)
    out = Path(out_dir) if out_dir is not None else default_model_dir(spec)
    if not force and _matching_build(out, spec):
        return out
    if out.exists() and any(out.iterdir()) and not (out / "build_info.json").exists():
        raise FileExistsError(
            f"{out} is a non-empty directory without build_info.json; refusing to overwrite it "
            "(pass an empty or new directory)"
        )

    import torch

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # bitwise-reproducible builds, and polite on shared CPUs
    try:
        _build(spec, tmp, verbose=verbose)
        if force or not _matching_build(out, spec):  # else a concurrent builder finished first
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _matching_build(out: Path, spec: TinyModelSpec) -> bool:
    try:
        info = json.loads((out / "build_info.json").read_text())
    except (OSError, ValueError):
        return False
    return info.get("args_hash") == spec.args_hash() and (out / "model.safetensors").exists()


def _build(spec: TinyModelSpec, out: Path, *, verbose: bool) -> None:
    import torch
    from transformers.utils import logging as hf_logging

    from stare.tasks import build_task

    t0 = time.perf_counter()
    task = build_task(spec.task_name)
    if not hasattr(task, "solution"):
        raise TypeError(
            f"task {spec.task_name!r} cannot write reference solutions (no `solution` method); "
            "the tiny-model warm start needs a SupervisedTask"
        )
    train = task.problems("train", spec.sft_max_steps * spec.sft_batch_size, seed=spec.seed)
    val = task.problems("train", spec.n_val, seed=spec.seed + 1_000_003)
    test = task.problems("test", spec.n_eval, seed=spec.seed)

    corpus = [getattr(task, "alphabet", "")]
    corpus += [p.prompt + task.solution(p) for p in train[:1000]] + [p.prompt for p in test]
    tokenizer = build_tokenizer(corpus, whole_tokens=getattr(task, "whole_tokens", ()))
    torch.manual_seed(spec.seed)
    model = _new_model(spec, tokenizer)
    log = _warm_start(model, tokenizer, task, train, val, spec, verbose=verbose)
    t_train = time.perf_counter() - t0

    result = evaluate(model, tokenizer, task, test, seed=spec.seed)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar for a one-file model
    try:
        model.save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(out)
    info = {
        "build_version": BUILD_VERSION,
        "args_hash": spec.args_hash(),
        "spec": dataclasses.asdict(spec),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "sft_steps": log["steps"],
        "sft_log": log["history"],
        "train_seconds": round(t_train, 2),
        "build_seconds": round(time.perf_counter() - t0, 2),
        "torch_version": torch.__version__,
        "recommended_max_new_tokens": 40,
        "eval": dataclasses.asdict(result),
    }
    (out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    if verbose:
        print(json.dumps({k: v for k, v in info.items() if k != "sft_log"}, indent=2))


def build_tokenizer(corpus: Sequence[str], whole_tokens: Sequence[str] = ()) -> PreTrainedTokenizerBase:
    """A character-level tokenizer over the characters of `corpus`, plus <pad>, <eos>, <unk>.

    Ids: <pad>=0, <eos>=1, <unk>=2, then the corpus characters in sorted order, then
    `whole_tokens` (strings that encode as one token wherever they occur, and decode as written,
    also with `skip_special_tokens=True`). Decoding fuses characters without spaces, so
    `decode(encode(s)) == s` for any string over the alphabet.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted({c for text in corpus for c in text})
    vocab = {tok: i for i, tok in enumerate([PAD, EOS, UNK, *chars])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([PAD, EOS, UNK])
    if whole_tokens:
        tok.add_tokens(list(whole_tokens))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        model_max_length=1024,
    )


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
            completion, label = [], []
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
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
                reduction="sum",
            ) / num_tokens
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

    if hasattr(task, "warm_start_sandbox"):
        return _evaluate_with_tool(model, tokenizer, task, problems, seed=seed, max_new_tokens=max_new_tokens)
    greedy_hits = _greedy_rewards(model, tokenizer, task, problems, max_new_tokens, batch_size)
    sample_hits: list[float] = []
    ent_sum, tok_count = 0.0, 0
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(problems), batch_size):
            chunk = problems[start : start + batch_size]
            new, logits = _complete(model, tokenizer, chunk, max_new_tokens, sample=True)
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


def _greedy_rewards(model, tokenizer, task, problems, max_new_tokens, batch_size) -> list[float]:
    if hasattr(task, "warm_start_sandbox"):
        texts = [_text(tokenizer, c[0]) for c in _agent_rollouts(model, tokenizer, task, problems,
                                                                   temperature=0.0, seed=0, max_new_tokens=max_new_tokens)]
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

    enc = tokenizer(
        [p.prompt for p in problems],
        return_tensors="pt",
        padding=True,
        padding_side="left",
        add_special_tokens=False,
    )
    model.eval()
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
    new = out.sequences[:, enc["input_ids"].shape[1] :]  # [B, T]
    logits = torch.stack(out.logits, dim=1) if sample else None  # [B, T, V]
    return new, logits


def _agent_rollouts(model, tokenizer, task, problems, *, temperature: float, seed: int, max_new_tokens: int) -> list:
    """One multi-turn completion per problem from the rollout's ToolAgent over a copy of `model`
    (HFEngine), tool calls answered by `task.warm_start_sandbox()`."""
    import tempfile

    from stare.rollout.agent_loop import ToolAgent
    from stare.rollout.engine import SamplingParams
    from stare.rollout.hf_engine import HFEngine

    from transformers.utils import logging as hf_logging

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
        return agent.generate(prompts, SamplingParams(n=1, max_new_tokens=max_new_tokens, temperature=temperature,
                                                      seed=seed, stop_token_ids=(tokenizer.eos_token_id,)))
    finally:
        engine.close()


def _text(tokenizer, completion) -> str:
    return tokenizer.decode(completion.token_ids, skip_special_tokens=True)


def _evaluate_with_tool(model, tokenizer, task, problems, *, seed: int, max_new_tokens: int) -> EvalResult:
    """`evaluate` for tool tasks. Entropy is estimated as the mean surprisal -log p of the sampled
    generated tokens (an unbiased estimate of the mean next-token entropy; the engine returns no
    full distributions); observation tokens are not counted."""
    greedy = [c[0] for c in _agent_rollouts(model, tokenizer, task, problems, temperature=0.0, seed=0,
                                            max_new_tokens=max_new_tokens)]
    sampled = [c[0] for c in _agent_rollouts(model, tokenizer, task, problems, temperature=1.0, seed=seed,
                                             max_new_tokens=max_new_tokens)]
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


def _accuracy_by_level(problems, hits: list[float]) -> dict[int, float]:
    by_level: dict[int, list[float]] = {}
    for p, hit in zip(problems, hits):
        by_level.setdefault(p.level, []).append(hit)
    return {k: _mean(v) for k, v in sorted(by_level.items())}


def _mean(xs: Sequence[float]) -> float:
    return round(sum(xs) / len(xs), 4) if xs else 0.0


def main(argv: Sequence[str] | None = None) -> int:
    """`stare build-model`: build (or reuse) the tiny model and print its directory."""
    parser = argparse.ArgumentParser(
        prog="stare build-model",
        description="Build the tiny Qwen2 policy + tokenizer for the embedded CPU demo (cached).",
    )
    parser.add_argument("--out", type=Path, default=None,
                        help="model directory (default: $STARE_CACHE_DIR/models/tiny-<task>-<hash>, "
                             "STARE_CACHE_DIR defaulting to ~/.cache/stare)")
    parser.add_argument("--seed", type=int, default=0, help="seed of data, init and warm start")
    parser.add_argument("--task", default="arithmetic", help="registered task name")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a TinyModelSpec field, e.g. --set sft_max_steps=100")
    parser.add_argument("--force", action="store_true", help="rebuild even if a matching build exists")
    parser.add_argument("--quiet", action="store_true", help="print only the directory")
    args = parser.parse_args(argv)

    fields = {f.name: f for f in dataclasses.fields(TinyModelSpec)}
    overrides: dict[str, Any] = {}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep or name not in fields or name in ("task_name", "seed"):
            valid = ", ".join(n for n in fields if n not in ("task_name", "seed"))
            parser.error(f"--set {item!r}: expected FIELD=VALUE with FIELD one of: {valid}")
        kind = type(getattr(TinyModelSpec(), name))
        try:
            overrides[name] = kind(value)
        except ValueError:
            parser.error(f"--set {item!r}: {name} must be a {kind.__name__}")

    path = build_tiny_model(args.out, task_name=args.task, seed=args.seed, force=args.force,
                            verbose=not args.quiet, **overrides)
    if not args.quiet:
        info = json.loads((path / "build_info.json").read_text())
        ev = info["eval"]
        print(f"params {info['num_parameters']}  sft steps {info['sft_steps']}  "
              f"build {info['build_seconds']} s  held-out greedy accuracy {ev['greedy_accuracy']}  "
              f"sampling entropy {ev['sample_entropy']} nats/token")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
