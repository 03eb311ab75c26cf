"""What determines a tiny-model build (hashed into its cache key), where builds are cached, and
the measurements a build records."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

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
        positive = (
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "max_positions",
            "sft_batch_size",
            "sft_check_every",
            "n_val",
            "n_eval",
        )
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
    from stare.data.tasks.registry import TASKS

    spec = TASKS.get(task_name)
    try:
        return None if spec is None else getattr(spec.build(), "build_version", None)
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
    from stare.runtime.paths import cache_dir

    return cache_dir() / "models"


def default_model_dir(spec: TinyModelSpec) -> Path:
    """Where `build_tiny_model` puts `spec` when no directory is given."""
    return default_cache_dir() / f"tiny-{spec.task_name}-{spec.args_hash()[:8]}"
