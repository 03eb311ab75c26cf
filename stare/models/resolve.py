"""Model resolution: the one place that turns a run config into a model directory, its tokenizer,
its stop ids and the run's task. Every role and application calls these (core: imports no role).

    path = resolve_model(cfg, log)         # model.path, SmolLM2 (model.source) or the tiny model (cached)
    setup = load_run_setup(cfg, log)       # path + tokenizer + task + stop ids
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stare.config import ConfigError, TrainConfig

if TYPE_CHECKING:
    import torch

    from stare.data.tasks.base import Task


def resolve_model(cfg: TrainConfig, log: Callable[[str], None]) -> Path:
    """`model.path` (checked to be a Hugging Face directory), else by `model.source`: SmolLM2-135M-Instruct
    (stare.models.smollm2) or the bundled tiny model, prepared on first use and cached under ~/.cache/stare."""
    if cfg.model.path is not None:
        check_model_dir(Path(cfg.model.path))
        return Path(cfg.model.path)
    if cfg.model.source == "smollm2":
        from stare.models.smollm2 import prepare_smollm2

        return prepare_smollm2(log=log)
    from stare.models.tiny import build_tiny_model

    t0 = time.perf_counter()
    try:
        path = build_tiny_model(task_name=cfg.task.name, seed=cfg.model.tiny_seed, **cfg.model.tiny)
    except TypeError as err:
        raise ConfigError(f"model.tiny: {err}; valid keys are the fields of stare.models.tiny.TinyModelSpec") from None
    log(f"tiny model ready at {path} ({time.perf_counter() - t0:.1f}s)")
    return path


def _json_file(path: Path) -> Any:
    import json

    from stare.config.files import FileInputError, read_text

    try:
        return json.loads(read_text(path, "model file"))
    except FileInputError as err:
        raise ConfigError(f"model.path: {err}") from None
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"model.path: {path} line {err.lineno} column {err.colno}: not valid JSON ({err.msg}); "
            f"restore the file from the model's source"
        ) from None


def _check_safetensors(path: Path) -> None:
    """The header parses and the file holds every byte it declares (a copy cut short fails here)."""
    import json
    import struct

    size = path.stat().st_size
    fix = "the file is damaged or cut short: copy it again from the model's source"
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
        if n is None or n > size - 8 or n > 100 << 20:
            raise ConfigError(f"model.path: {path}: not a safetensors file ({size} bytes, no valid header); {fix}")
        try:
            header = json.loads(f.read(n))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError):
            raise ConfigError(f"model.path: {path}: unreadable safetensors header; {fix}") from None
    if size < 8 + n + end:
        raise ConfigError(f"model.path: {path}: {size} bytes, its header declares {8 + n + end}; {fix}")


def check_model_dir(path: Path) -> None:
    """A model.path that will load, checked in milliseconds before anything heavy: a folder with a
    config.json that parses, tokenizer JSON files that parse, and safetensors weights whose headers
    parse and whose sizes cover what they declare. Errors name the file (and the line for JSON)."""
    if not path.is_dir():
        raise ConfigError(f"model.path: {path} is not a folder; pass a local Hugging Face model directory")
    if not (path / "config.json").is_file():
        raise ConfigError(f"model.path: {path} is not a Hugging Face model directory (no config.json)")
    if not isinstance(_json_file(path / "config.json"), dict):
        raise ConfigError(f"model.path: {path / 'config.json'} must hold a JSON object")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "model.safetensors.index.json"):
        if (path / name).is_file():
            _json_file(path / name)
    weights = sorted(path.glob("*.safetensors"))
    if not weights and not list(path.glob("*.bin")):
        raise ConfigError(f"model.path: {path} has no weights (no *.safetensors or *.bin file)")
    for w in weights:
        _check_safetensors(w)


MODEL_DTYPES = ("float32", "bfloat16", "float16")  # model.dtype, the rollout engines' dtype


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a model.dtype / engine dtype name; ValueError naming the choices."""
    import torch

    if name not in MODEL_DTYPES:
        raise ValueError(f"dtype must be one of {list(MODEL_DTYPES)}, got {name!r}")
    dtype: torch.dtype = getattr(torch, name)
    return dtype


def stop_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """The ids sampling stops on (the tokenizer's EOS; the engines add the model's own)."""
    return tuple(i for i in (tokenizer.eos_token_id,) if i is not None)


@dataclass
class RunSetup:
    """What every process of a run derives from the config alone."""

    model_path: Path
    tokenizer: Any
    task: Task
    stop_ids: tuple[int, ...]


def load_run_setup(cfg: TrainConfig, log: Callable[[str], None], model_path: Path | None = None) -> RunSetup:
    """Resolve the model (unless given; its context checked against the config), load its tokenizer and
    build the run's task."""
    from transformers import AutoTokenizer

    from stare.data.tasks.registry import build_task
    from stare.models.context import check_context, model_positions

    path = model_path if model_path is not None else resolve_model(cfg, log)
    check_context(cfg, *model_positions(cfg, path))  # every role, before a model loads
    tokenizer = AutoTokenizer.from_pretrained(path)
    task = build_task(cfg.task.name, **cfg.task.build_kwargs(tokenizer))
    return RunSetup(model_path=path, tokenizer=tokenizer, task=task, stop_ids=stop_token_ids(tokenizer))
