"""Memory plan of a run: what each role needs per GPU, whether it fits, and which field to change.

    stare plan --config C [--gpus N] [--gpu-mem-gib G]      (the learner also checks itself at start)

The learner's terms: stare/plan/learner_memory.py; a rollout GPU's: stare/plan/rollout_memory.py; what a
plan is made of and when a role fits: stare/plan/plan_items.py.
"""

from __future__ import annotations

from stare.config import ConfigError, TrainConfig
from stare.plan.learner_memory import plan_learner
from stare.plan.plan_items import (
    GIB,
    HEADROOM,
    RECEIVE_RESERVE,
    VLLM_PROFILE_TOKENS,
    Fix,
    Item,
    Plan,
    RolePlan,
    StageStates,
    _prompt_tokens,
    _whole_plan,
)
from stare.plan.rollout_memory import plan_rollout
from stare.plan.sizes import ModelShape, load_model_shape

# the plan's names, as callers import them from here
__all__ = ["GIB", "HEADROOM", "RECEIVE_RESERVE", "VLLM_PROFILE_TOKENS", "Fix", "Item", "Plan", "RolePlan", "build_plan"]


def build_plan(
    cfg: TrainConfig,
    *,
    gpus: int,
    gpu_mem_gib: float,
    shape: ModelShape | None = None,
    prompt_tokens: int | None = None,
    roles: tuple[str, ...] = ("learner", "rollout"),
    config_name: str = "",
) -> Plan:
    """The memory plan of `cfg` with the learner on `gpus` GPUs and each rollout worker on one, of
    `gpu_mem_gib` GiB each (one GPU shared by both, `stare train` colocated: stare.plan.colocation)."""
    if gpus < 1:
        raise ConfigError(f"--gpus must be >= 1, got {gpus}")
    if gpu_mem_gib <= 0:
        raise ConfigError(f"--gpu-mem-gib must be > 0, got {gpu_mem_gib}")
    shape = shape or load_model_shape(cfg)
    prompt, source = _prompt_tokens(cfg, shape, prompt_tokens)
    seq = prompt + cfg.rollout.max_new_tokens
    mem = int(gpu_mem_gib * GIB)
    out: list[RolePlan] = []
    stages: dict[int, StageStates] = {}
    if "learner" in roles:
        learner, stages = plan_learner(cfg, shape, gpus=gpus, gpu_mem_bytes=mem, seq_tokens=seq)
        out.append(learner)
    if "rollout" in roles:
        out.append(plan_rollout(cfg, shape, gpu_mem_bytes=mem, seq_tokens=seq))
    return _whole_plan(cfg, shape, prompt, source, out, stages, config_name)
