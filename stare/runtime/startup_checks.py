"""Checks of a config against the machine and the model, made before a run starts (before its folder is
created, before a model loads), each a ConfigError naming the field and the fix:

- `check_threads(cfg)`: `run.threads` at most the CPUs this process may run on (os.sched_getaffinity:
  a container's or taskset's cpuset, not the host's count). More threads than that only contend, and
  torch aborts (segfaults) when the OS refuses to start that many.
- `check_context(cfg, positions, source)`: `rollout.max_new_tokens` must leave room for a prompt in the
  model's context (config.json `max_position_embeddings`, or `rollout.engine.max_model_len`), and
  `data.max_prompt_len + rollout.max_new_tokens` must fit it; otherwise every prompt would be cut to
  nothing (or to a few tokens) before sampling.
- `model_positions(cfg, model_path)`: that context, from the model folder, or from the bundled tiny
  model's spec when it is not built yet.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from stare.config import ConfigError, TrainConfig


def usable_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def check_threads(cfg: TrainConfig) -> None:
    threads, cpus = cfg.run.threads, usable_cpus()
    if threads is not None and threads > cpus:
        raise ConfigError(
            f"run.threads={threads}: this machine lets stare run on {cpus} CPUs; set run.threads to at most "
            f"{cpus} (or leave it unset for torch's default)"
        )


def apply_threads(cfg: TrainConfig) -> None:
    """torch's intra-op threads from run.threads (checked first); nothing when it is unset."""
    check_threads(cfg)
    if cfg.run.threads is not None:
        import torch

        torch.set_num_threads(cfg.run.threads)


def model_positions(cfg: TrainConfig, model_path: Path | None) -> tuple[int | None, str]:
    """(the model's context in tokens, where that number comes from); (None, "") when unknown."""
    engine_len = getattr(cfg.rollout.engine, "max_model_len", None)
    if engine_len is not None:
        return int(engine_len), "rollout.engine.max_model_len"
    if model_path is not None:
        try:
            config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
            positions = config.get("text_config", config).get("max_position_embeddings")
        except (OSError, ValueError, AttributeError):
            return None, ""  # check_model_dir names what is wrong with the folder
        return (
            (int(positions), f"max_position_embeddings in {Path(model_path) / 'config.json'}")
            if positions
            else (
                None,
                "",
            )
        )
    if cfg.model.source == "tiny":
        from stare.models.tiny.spec import TinyModelSpec

        try:
            spec = TinyModelSpec(task_name=cfg.task.name, seed=cfg.model.tiny_seed, **cfg.model.tiny)
        except (TypeError, ValueError):
            return None, ""  # resolve_model names a bad model.tiny
        return spec.max_positions, "the bundled tiny model's max_positions (model.tiny.max_positions)"
    return None, ""


def check_context(cfg: TrainConfig, positions: int | None, source: str) -> None:
    if positions is None:
        return
    new, prompt = cfg.rollout.max_new_tokens, cfg.data.max_prompt_len
    if new >= positions:
        raise ConfigError(
            f"rollout.max_new_tokens={new} leaves no room for a prompt in the model's context of {positions} tokens "
            f"({source}); lower rollout.max_new_tokens below {positions} minus the prompt length"
        )
    if prompt is not None and prompt + new > positions:
        raise ConfigError(
            f"data.max_prompt_len={prompt} + rollout.max_new_tokens={new} = {prompt + new} tokens exceed the model's "
            f"context of {positions} tokens ({source}); lower one of them (their sum at most {positions})"
        )
