"""gpu-generate: the HF rollout engine's generation tokens/s vs transformers'
`model.generate(output_scores=True)` (the same sampling: temperature 1, no top-k/top-p, the same
prompts and lengths), on a model built from a config (random weights). Skipped without CUDA; the
tests run the same code on the CPU at a tiny size. Usage: `stare bench gpu` (quick: `--quick`)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from stare.app.bench.bench_gpu import NO_CUDA, QWEN_0_5B, _clock, _cuda, _device_name, build_model
from stare.app.bench.common import paired_row, skipped


def save_model(model, path: Path) -> Path:
    from transformers import GenerationConfig

    model.save_pretrained(path)
    eos = model.config.eos_token_id
    GenerationConfig(eos_token_id=eos, pad_token_id=model.config.pad_token_id, bos_token_id=eos).save_pretrained(path)
    return path


def measure_generate(
    *,
    device: str,
    shape: dict[str, int],
    prompts: int,
    samples: int,
    prompt_len: int,
    max_new_tokens: int,
    repeats: int,
    dtype: str = "bfloat16",
) -> list[dict[str, Any]]:
    """One row: HFEngine tokens/s vs model.generate(output_scores=True), same prompts, interleaved."""
    from rollout.engines.base import SamplingParams
    from rollout.engines.hf_engine import HFEngine

    dev = torch.device(device)
    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[dtype]
    with tempfile.TemporaryDirectory(prefix="stare-bench-gen-") as tmp:
        model_dir = save_model(build_model(shape, torch.device("cpu"), torch_dtype), Path(tmp) / "model")
        engine = HFEngine(str(model_dir), dtype=dtype, device=device, max_batch_size=prompts * samples)
    model, eos = engine.model, engine.eos_token_ids[0]
    g = torch.Generator().manual_seed(0)
    prompt_ids = [torch.randint(1, shape["vocab"] - 1, (prompt_len,), generator=g).tolist() for _ in range(prompts)]
    params = SamplingParams(n=samples, max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, seed=0)
    ids = torch.tensor(prompt_ids, device=dev)  # [P, L] (equal lengths: no padding needed)

    def ours() -> int:
        return sum(len(c.token_ids) for group in engine.generate(prompt_ids, params) for c in group)

    def baseline() -> int:
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new_tokens,
                num_return_sequences=samples,
                output_scores=True,
                return_dict_in_generate=True,
                eos_token_id=eos,
                pad_token_id=0,
            )
        new = out.sequences[:, prompt_len:]  # [P x n, T]
        hit = (new == eos).int()  # tokens up to and including the first EOS count
        after = hit.cumsum(-1) - hit  # [P x n, T] EOS seen before this position
        return int((after == 0).sum())  # host sync

    ours(), baseline()  # warm-up
    rates: dict[str, list[float]] = {"ours": [], "baseline": []}
    for r in range(repeats):
        for name, fn in (
            (("ours", ours), ("baseline", baseline)) if r % 2 == 0 else (("baseline", baseline), ("ours", ours))
        ):
            n = [0]
            t = _clock(lambda: n.__setitem__(0, fn()), dev)
            rates[name].append(n[0] / t)
    engine.close()
    return [
        paired_row(
            "gpu-generate",
            f"HF engine vs transformers generate(output_scores) on {_device_name(dev)} "
            f"({prompts} prompts x {samples}, {prompt_len} + <= {max_new_tokens} tokens, {dtype})",
            rates["ours"],
            rates["baseline"],
            unit="tokens/s",
        )
    ]


# --- the registry's entries ---------------------------------------------------------------------


def run_generate(quick: bool) -> list[dict[str, Any]]:
    if not _cuda():
        return [skipped("gpu-generate", "HF engine generation tokens/s on a GPU", NO_CUDA, unit="tokens/s")]
    return measure_generate(
        device="cuda",
        shape=QWEN_0_5B,
        prompts=32,
        samples=8,
        prompt_len=256,
        max_new_tokens=256 if quick else 1024,
        repeats=3 if quick else 5,
    )
