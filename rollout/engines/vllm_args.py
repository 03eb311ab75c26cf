"""The vLLM engine's arguments and the pieces of it that need no vLLM (rollout/engines/vllm_engine.py is the module
that imports vLLM): the `rollout.engine` section as `LLM(...)` arguments, the request seeds, the checkpoint's
parameter names, the weight versions of a completion, and the engine's life in a shared process (sleep-mode
arguments, one sleeping engine per process, the default process group kept at shutdown)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


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


def version_runs(spans: Any) -> list[tuple[int, int]]:
    """`Completion.versions` from a finished vLLM output's `weight_versions` (WeightVersionSpan(version,
    start, end), the labels this engine set: `str(version)`); None (no label reported) is []."""
    return [(span.start, int(span.version)) for span in spans or ()]


def sleep_args(sleep_mode: bool, enforce_eager: bool, accepted: set[str]) -> dict[str, Any]:
    """The sleep-mode arguments of `LLM(...)`: `enable_sleep_mode`, and with CUDA graphs
    `sleep_mode_offload_cudagraph` where the installed vLLM has it (`accepted`: its EngineArgs fields; 0.32:
    "Back up CUDA graph memory to CPU during sleep, restored in place on wake", vllm/config/model.py; its
    default False leaves the graph pool on the GPU while the learner steps)."""
    if not sleep_mode:
        return {}
    out: dict[str, Any] = {"enable_sleep_mode": True}
    if not enforce_eager and "sleep_mode_offload_cudagraph" in accepted:
        out["sleep_mode_offload_cudagraph"] = True
    return out


# The sleep-mode engines of this process: vLLM's sleep mode allocates through one CuMem allocator per process
# (vllm/device_allocator/cumem.py `CuMemAllocator.get_instance`), so a second sleeping engine would offload the
# first one's weights with its own.
sleeping_engines: weakref.WeakSet[Any] = weakref.WeakSet()


def refuse_second_sleeping_engine() -> None:
    if any(getattr(e, "llm", None) is not None for e in sleeping_engines):
        raise RuntimeError(
            "a second vLLM engine with sleep mode in one process: vLLM's sleep mode has one CuMem allocator per "
            "process, so sleeping either engine would offload both; close the first (VLLMEngine.close) or build "
            "the second in another process"
        )


@contextlib.contextmanager
def default_group_kept(keep: bool) -> Iterator[None]:
    """Within the block, `torch.distributed.destroy_process_group()` of the default group does nothing when
    `keep`: a vLLM engine's shutdown (vllm/distributed/parallel_state.py `destroy_distributed_environment`) in a
    process whose default group is the learner's. Other groups (vLLM's own) are destroyed as asked."""
    import torch.distributed as dist

    if not keep or not dist.is_available():
        yield
        return
    destroy = dist.destroy_process_group

    def guarded(group: Any = None) -> None:
        if group is None or (dist.is_initialized() and group is dist.group.WORLD):
            log.info("the rollout engine's shutdown left the default process group alone (it is not the engine's)")
            return
        destroy(group)

    dist.destroy_process_group = guarded
    try:
        yield
    finally:
        dist.destroy_process_group = destroy
