"""The model's context against the config, checked before a run starts (before its folder is created,
before a model loads) and by every role's setup: `rollout.max_new_tokens` must leave room for a prompt
in the model's context (config.json `max_position_embeddings`, or `rollout.engine.max_model_len`), and
`data.max_prompt_len + rollout.max_new_tokens` must fit it; otherwise every prompt would be cut to
nothing (or to a few tokens) before sampling. `model_positions` reads that context from the model folder,
or from the bundled tiny model's spec when it is not built yet."""

from __future__ import annotations

import json
from pathlib import Path

from stare.config import ConfigError, TrainConfig


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
