"""The learner's start-up check: refuse a config whose roles cannot fit this machine's GPU (the
same plan as `stare plan`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from stare.config import ConfigError, TrainConfig
from stare.plan.gpu_memory import GIB, HEADROOM, Plan, build_plan
from stare.plan.render import render
from stare.plan.sizes import load_model_shape


def check_fits(
    cfg: TrainConfig,
    model_path: Path | str | None,
    *,
    roles: tuple[str, ...] = ("learner",),
    log: Callable[[str], None] = print,
) -> Plan | None:
    """Refuse (ConfigError naming the field) a config whose roles cannot fit this machine's GPU.

    Learner ranks: an external launcher's WORLD_SIZE, else system.learner_ranks; each role is checked
    against one whole GPU (node-colocated, system.colocate on: the learner step and sampling on each
    rank's GPU, stare.plan.colocation.build_node_plan).
    Without CUDA there is nothing to check: it logs that and returns None."""
    import torch

    if not torch.cuda.is_available():
        log("memory plan: no CUDA device, skipped (stare plan --gpu-mem-gib G plans for a GPU)")
        return None
    mem = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    gpus = int(os.environ.get("WORLD_SIZE", cfg.system.learner_ranks))
    shape = load_model_shape(cfg, Path(model_path) / "config.json" if model_path is not None else None)
    from stare.config.colocation import node_colocated

    if node_colocated(cfg) and gpus > 1:  # each rank's GPU holds its learner and, in turns, its engine
        from stare.plan.colocation import build_node_plan

        plan = build_node_plan(cfg, gpus=gpus, gpu_mem_gib=mem / GIB, shape=shape)
    else:
        plan = build_plan(cfg, gpus=gpus, gpu_mem_gib=mem / GIB, shape=shape, roles=roles)
    for r in plan.roles:
        if not r.fits:
            raise ConfigError(
                f"the {r.role} needs {r.total / GIB:.1f} GiB per GPU, {r.usable / GIB:.1f} GiB usable on this "
                f"{mem / GIB:.0f} GiB GPU ({r.gpus} rank(s)); change: "
                + "; ".join(map(str, r.fixes))
                + f"\n{render(plan)}"
            )
    log(
        f"memory plan: {', '.join(f'{r.role} {r.total / GIB:.1f} GiB' for r in plan.roles)} of "
        f"{HEADROOM * mem / GIB:.1f} GiB usable per GPU: fits"
    )
    return plan
