"""The GPU section: figures that only mean something on a CUDA device. Where there is none, each
benchmark returns one row saying it was skipped and why. The models are built from a config
(random weights, Qwen2.5-0.5B's shape by default; the GPU nodes have no model hub either).

  * gpu-learner:        the learner's step on the GPU (collate, no-grad pre-pass, `plan_step`,
                        micro-batches of forward + `token_logprobs_and_entropy` + `policy_loss` +
                        backward, fused AdamW) in bf16: tokens/s (prompt + response tokens through
                        the step) and MFU. The baseline is this device's own dense bf16 matmul
                        rate, measured in the same run, so the ratio is the MFU against a measured
                        (not a datasheet) peak. Not through DeepSpeed: the device image has none,
                        and `Learner` still allocates its step tensors on the CPU.
  * gpu-logprob-memory: peak memory above the inputs of the learner's chunked log-prob/entropy
                        computation (`learner.step.logprobs.chunked_logprobs_and_entropy`,
                        forward + backward) at vocab 151,936, vs the full [N, V] fp32 log-softmax
                        (<= 0.25, the learner issue's target), and its time (<= 1.15).
  * gpu-generate:       bench_gpu_generate.py.

Each measure_* function takes a device, so the tests run the same code on the CPU at a tiny size.
Usage: `stare bench gpu` (quick: `--quick`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from stare.app.bench.common import median, paired_row, row, skipped

NO_CUDA = "no CUDA device here (torch.cuda.is_available() is False); run `stare bench gpu` on a GPU node"
QWEN_0_5B = dict(hidden=896, layers=24, heads=14, kv_heads=2, ffn=4864, vocab=151_936)
VOCAB_QWEN = 151_936


def _cuda() -> bool:
    return torch.cuda.is_available()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _clock(fn: Callable[[], Any], device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)  # host sync: the timing boundary
    return time.perf_counter() - t0


def build_model(shape: dict[str, int], device: torch.device, dtype: torch.dtype, seed: int = 0):
    """A Qwen2 causal LM with random weights of the given shape."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        hidden_size=shape["hidden"],
        intermediate_size=shape["ffn"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        vocab_size=shape["vocab"],
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        eos_token_id=shape["vocab"] - 1,
        bos_token_id=shape["vocab"] - 1,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).to(device)


def matmul_flops(device: torch.device, dtype: torch.dtype, n: int = 8192, iters: int = 20) -> float:
    """FLOP/s of a dense n x n matmul on `device` (median of `iters`, after a warm-up)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    times = [_clock(lambda: a @ b, device) for _ in range(iters + 2)][2:]
    return 2 * n**3 / median(times)


def _to(batch, device: torch.device):
    """The TrainBatch with its tensors on `device` (moved once per step)."""
    moved = {
        f.name: getattr(batch, f.name).to(device)
        for f in dataclasses.fields(batch)
        if isinstance(getattr(batch, f.name), torch.Tensor)
    }
    return dataclasses.replace(batch, **moved)


def compute_params(model) -> int:
    """Parameters that take part in matmuls: all but the input embedding (a lookup), plus the
    output projection when it is tied to the embedding (then it is no parameter of its own)."""
    emb = model.get_input_embeddings().weight
    n = sum(p.numel() for p in model.parameters()) - emb.numel()
    return n + (emb.numel() if model.config.get_text_config().tie_word_embeddings else 0)


def measure_learner(
    *,
    device: str,
    shape: dict[str, int],
    groups: int,
    group_size: int,
    max_response: int,
    prompt_len: int,
    micro_batch: int,
    repeats: int,
    dtype: torch.dtype = torch.bfloat16,
    matmul_n: int = 8192,
) -> list[dict[str, Any]]:
    """One row: tokens/s of the learner's step (prompt + response tokens through the pre-pass and
    the training pass), against the tokens/s a dense matmul at this device's measured rate would
    give for the same FLOPs (ratio = MFU vs the measured peak)."""
    from learner.algorithm.losses import LossInputs, policy_loss
    from learner.algorithm.step_plan import StepTokens, mean_entropy, plan_step
    from learner.step.batch import collate, token_logprobs_and_entropy
    from stare.app.bench.bench_learner import synthetic_groups
    from stare.config.algo import StareLossConfig

    dev = torch.device(device)
    model = build_model(shape, dev, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=dev.type == "cuda")
    cfg = StareLossConfig(variant="C2")
    rows = groups * group_size
    n_mb = math.ceil(rows / micro_batch)

    def step(k: int) -> tuple[float, float]:
        trajectories = synthetic_groups(groups, group_size, shape["vocab"], max_response, prompt_len=prompt_len, step=k)
        t0 = time.perf_counter()
        batch = _to(collate(trajectories, pad_id=0, rows=n_mb * micro_batch), dev)
        S, L = batch.mask.shape
        old = torch.zeros(S, L, device=dev)  # [S, L]
        ent = torch.zeros(S, L, device=dev)  # [S, L]
        mbs = [(slice(i * micro_batch, (i + 1) * micro_batch),) for i in range(n_mb)]
        mbs = [(sl, batch.rows(sl)) for (sl,) in mbs]
        model.eval()
        with torch.no_grad():
            for sl, mb in mbs:
                logits = model(
                    input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids
                ).logits
                lp, e = token_logprobs_and_entropy(logits, mb)
                old[sl, : lp.shape[1]], ent[sl, : lp.shape[1]] = lp, e
                del logits
        model.train()
        tokens = StepTokens(old, ent, batch.advantages, batch.token_uid, batch.mask)
        h = float(mean_entropy(ent, batch.mask, cfg.agg_mode))  # host sync: once per step (the gate)
        ctx = plan_step(tokens, cfg, gate=float(h < 0.3), w=1.1, m=0.9, seed=k)
        for sl, mb in mbs:
            logits = model(
                input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids
            ).logits
            lp, e = token_logprobs_and_entropy(logits, mb)
            n = lp.shape[1]
            x = LossInputs(
                logprobs=lp,
                old_logprobs=old[sl, :n],
                advantages=mb.advantages,
                mask=mb.mask,
                token_uid=mb.token_uid,
                entropy=e,
                step_entropy=ent[sl, :n],
                rollout_logprobs=mb.rollout_logprobs,
            )
            policy_loss(x, ctx, cfg).loss.backward()
            del logits
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(dev)
        elapsed = time.perf_counter() - t0
        return float(batch.attention_mask.sum()), elapsed  # host sync: once per step

    step(0)  # warm-up: allocator, kernels
    samples = [step(k + 1) for k in range(repeats)]
    peak = matmul_flops(dev, dtype, n=matmul_n)
    flops_per_token = 8 * compute_params(model)  # forward + backward (6N) + the no-grad pre-pass (2N)
    ours = [tok / t for tok, t in samples]
    at_peak = peak / flops_per_token
    dtype_name = str(dtype).removeprefix("torch.")
    return [
        row(
            "gpu-learner",
            f"learner step on {_device_name(dev)}: tokens/s ({compute_params(model) / 1e6:.0f}M "
            f"compute params, {rows} seqs, prompt <= {prompt_len}, response <= {max_response}, micro-batch "
            f"{micro_batch}, {dtype_name}) vs a dense matmul's rate (ratio = MFU)",
            ours=median(ours),
            baseline=at_peak,
            unit="tokens/s",
            spread=[min(ours) / at_peak, max(ours) / at_peak],
            repeats=repeats,
            matmul_tflops=peak / 1e12,
            achieved_tflops=median(ours) * flops_per_token / 1e12,
        )
    ]


def _device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def _peak_bytes(fn: Callable[[], Any], device: torch.device) -> float | None:
    """Peak memory allocated while fn runs, above what was allocated before (CUDA only)."""
    if device.type != "cuda":
        fn()
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return float(torch.cuda.max_memory_allocated(device) - before)


def full_logprobs_entropy(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor):
    """The reference: the whole [N, V] fp32 log-softmax at once (what an unchunked learner computes)."""
    logp_full = torch.log_softmax(head(hidden).float(), -1)  # [N, V]
    logprobs = logp_full.gather(-1, targets[:, None]).squeeze(-1)  # [N]
    entropy = -(logp_full.exp() * logp_full).sum(-1)  # [N]
    return logprobs, entropy


def measure_logprob_memory(
    *, device: str, tokens: int, hidden_size: int, vocab: int, repeats: int, dtype: torch.dtype = torch.bfloat16
) -> list[dict[str, Any]]:
    """Rows gpu-logprob-memory (peak bytes above the inputs, CUDA only) and gpu-logprob-time: the
    learner's `chunked_logprobs_and_entropy` (chunks of tokens/8) + backward vs the full fp32
    log-softmax, on the same hidden states and output head."""
    from learner.step.logprobs import chunked_logprobs_and_entropy

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    head = torch.nn.Linear(hidden_size, vocab, bias=False, device=dev, dtype=dtype)
    with torch.no_grad():
        head.weight.normal_(0, 0.02, generator=g)
    hidden = torch.randn(tokens, hidden_size, device=dev, dtype=dtype, generator=g).requires_grad_(True)  # [N, H]
    targets = torch.randint(0, vocab, (tokens,), device=dev, generator=g)  # [N]
    chunk = max(tokens // 8, 1)
    arms = {
        "ours": lambda: chunked_logprobs_and_entropy(head, hidden, targets, chunk_tokens=chunk)[:2],
        "baseline": lambda: full_logprobs_entropy(head, hidden, targets),
    }

    def run(arm: str) -> None:
        lp, e = arms[arm]()
        (lp.sum() + 0.01 * e.sum()).backward()
        hidden.grad, head.weight.grad = None, None

    mem = {k: _peak_bytes(lambda k=k: run(k), dev) for k in arms}  # also the warm-up
    times: dict[str, list[float]] = {"ours": [], "baseline": []}
    for r in range(repeats):
        for k in ("ours", "baseline") if r % 2 == 0 else ("baseline", "ours"):
            times[k].append(_clock(lambda: run(k), dev))
    size = f"{tokens:,} tokens, hidden {hidden_size}, vocab {vocab:,}, {str(dtype).removeprefix('torch.')}, chunks of {chunk}"
    what = "learner chunked log-prob/entropy + backward vs full fp32 log-softmax"
    out = []
    if mem["ours"] is None:
        out.append(
            skipped(
                "gpu-logprob-memory",
                f"{what}: peak memory ({size})",
                "peak memory is measured on CUDA only",
                unit="GiB",
                target=0.25,
                higher_is_better=False,
            )
        )
    else:
        out.append(
            row(
                "gpu-logprob-memory",
                f"{what}: peak memory above the inputs ({size})",
                ours=mem["ours"] / 2**30,
                baseline=mem["baseline"] / 2**30,
                unit="GiB",
                target=0.25,
                higher_is_better=False,
            )
        )
    out.append(
        paired_row(
            "gpu-logprob-time",
            f"{what}: time ({size})",
            times["ours"],
            times["baseline"],
            unit="s",
            target=1.15,
            higher_is_better=False,
        )
    )
    return out


def run_learner(quick: bool) -> list[dict[str, Any]]:
    if not _cuda():
        return [skipped("gpu-learner", "learner tokens/s and MFU on a GPU", NO_CUDA, unit="tokens/s")]
    return measure_learner(
        device="cuda",
        shape=QWEN_0_5B,
        groups=8,
        group_size=8,
        max_response=1024 if quick else 2048,
        prompt_len=256,
        micro_batch=8,
        repeats=3 if quick else 7,
    )


def run_logprob_memory(quick: bool) -> list[dict[str, Any]]:
    if not _cuda():
        return [
            skipped(
                "gpu-logprob-memory",
                "log-prob/entropy peak memory at vocab 151,936 on a GPU",
                NO_CUDA,
                unit="GiB",
                target=0.25,
                higher_is_better=False,
            )
        ]
    return measure_logprob_memory(
        device="cuda", tokens=8192 if quick else 16384, hidden_size=1536, vocab=VOCAB_QWEN, repeats=3 if quick else 7
    )
