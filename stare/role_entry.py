"""The entry point of each role process (`stare learner|rollout|reward`, `stare up`, the Ray
actors): an application, so it may wire one role's pieces into another's seams. The learner gets
its held-out evaluator from the rollout stack here (roles never import each other)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from stare.config import TrainConfig

ROLES = ("learner", "rollout", "reward")


def learner_evaluator(cfg: TrainConfig, model_path: Path):
    """The distributed learner's evaluator: the shared `StackEvaluator` on a transformers engine in
    the learner's process (the rollout engines are busy sampling)."""
    import logging

    from stare.rollout.stack import StackEvaluator, build_rollout_stack

    stack = build_rollout_stack(cfg, logging.getLogger("stare.learner").info, model_path=model_path, engine="hf")
    return StackEvaluator(stack, cfg)


def run_role(kind: str, cfg: TrainConfig, *, redis_url: str, name: str, stop=None, **extra: Any) -> None:
    if kind not in ROLES:
        raise ValueError(f"unknown role {kind!r}; valid roles: {ROLES}")
    module = importlib.import_module(f"stare.{kind}.role")
    if kind == "learner":
        extra["evaluator_factory"] = learner_evaluator
    module.run(cfg, redis_url=redis_url, name=name, stop=stop, **extra)
