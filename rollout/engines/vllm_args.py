"""The vLLM engine's arguments and the pieces of it that need no vLLM (rollout/engines/vllm_engine.py is the module
that imports vLLM): the `rollout.engine` section as `LLM(...)` arguments, the request seeds, the checkpoint's
parameter names."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch


def request_seed(seed: int, index: int) -> int:
    """A 62-bit seed for prompt `index` of a call made with `seed` (vLLM adds the child index)."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def checkpoint_parameter_names(model_path: str | Path) -> set[str]:
    """Tensor names in the model directory's safetensors files (HF checkpoint names)."""
    from safetensors import safe_open

    path = Path(model_path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text())["weight_map"])
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors file (the vLLM engine loads safetensors)")
    names: set[str] = set()
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            names.update(st.keys())
    return names


ENGINE_ARGS = (
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "enforce_eager",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "enable_prefix_caching",
)
"""Fields of the `rollout.engine` vllm section passed to vLLM's `LLM(...)` under the same names."""


def resolve_enforce_eager(enforce_eager: bool | None, cuda_available: bool) -> bool:
    """`rollout.engine.enforce_eager` as vLLM gets it: an explicit value as given; None (auto) is
    False (CUDA graphs: 1.5-3x faster decoding at small batches, ~10-60 s more start-up and some
    GPU memory for the captured graphs) where CUDA is present, True (eager) on CPU."""
    return (not cuda_available) if enforce_eager is None else enforce_eager


def engine_args(section: Any, cuda_available: bool | None = None) -> dict[str, Any]:
    """vLLM engine arguments from a `VllmEngineSection` (or VLLMEngineConfig): every field in
    ENGINE_ARGS, those set to None left to vLLM's default, except `enforce_eager`, which is always
    resolved (`resolve_enforce_eager`; `cuda_available` None: ask torch). Pure: imports no vLLM."""
    args = {k: v for k in ENGINE_ARGS if (v := getattr(section, k)) is not None}
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    args["enforce_eager"] = resolve_enforce_eager(section.enforce_eager, cuda_available)
    return args


def section_defaults() -> dict[str, Any]:
    from stare.config import VllmEngineSection

    return engine_args(VllmEngineSection())
