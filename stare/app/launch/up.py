"""`stare up`: the whole distributed system, on a target (`--target`): processes on this machine (the
default; stare.app.launch.processes), Docker Compose on this machine (compose.py) or a Ray cluster
(ray.py). Every target is a stare.app.launch.base.Launcher run in the foreground by
stare.app.launch.run.run_until_done. Without a target it can also print the GPU map and every
role's command (`--print-plan`) or the compose services of the plan (`--print-compose`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from stare.app.launch.processes import ProcessLauncher, gpu_env, role_argv, role_names, with_overrides
from stare.app.launch.run import run_until_done
from stare.config import ConfigError, TrainConfig
from stare.config.colocation import check_node_colocation, node_colocated
from stare.plan.gpu_map import GpuPlan, node_gpu_count, plan_gpus


def node_plan(
    cfg: TrainConfig,
    *,
    rollout: int | None,
    gpus: int | None = None,
    learner_gpus: str | None = None,
    rollout_gpus: str | None = None,
) -> GpuPlan:
    """The GPU map of this node (`gpus`: override the detected count, e.g. to print a plan)."""
    engine = cfg.rollout.engine
    return plan_gpus(
        node_gpu_count() if gpus is None else gpus,
        rollout=rollout,
        tensor_parallel_size=getattr(engine, "tensor_parallel_size", 1),
        learner_gpus=learner_gpus,
        rollout_gpus=rollout_gpus,
        learner_ranks=cfg.system.learner_ranks,
        colocated=node_colocated(cfg),
    )


def format_plan(
    cfg: TrainConfig, plan: GpuPlan, *, rollout: int, reward: int, control: bool, redis_url: str | None
) -> str:
    """What `stare up` would start, without starting anything: the GPU map, then every role's
    command, environment and ports (`stare up --print-plan`)."""
    config_path = cfg.run_dir / "up" / "config.yaml"
    s, lines = cfg.system, [f"GPU map ({plan.gpus} GPUs on this node):"]
    ranks = cfg.system.learner_ranks
    if plan.gpus:
        lines.append(
            f"  learner: {plan.learner} ({ranks} rank{'s' if ranks > 1 else ''}, one GPU each"
            + (", each hosting a rollout engine)" if plan.colocated else ")")
        )
        lines += [f"  rollout-{i}: {g}" for i, g in enumerate(plan.rollout)]
        if plan.colocated:
            lines.append(
                "  rollout: none of its own (system.colocate on: every learner rank samples on its GPU, its "
                "engine asleep while the learner steps)"
            )
        lines.append(f"  unused: {plan.unused}")
        if plan.shared:
            lines.append(
                "  (one GPU: the rollout worker shares the learner's; set rollout.engine.gpu_memory_utilization"
                " so that both fit)"
            )
    else:
        lines.append(
            "  none: every role runs on CPU"
            + (
                f" ({ranks} learner rank{'s' if ranks > 1 else ''}, each hosting a rollout engine)"
                if plan.colocated
                else ""
            )
        )
    redis = redis_url or "a redis-server on a free local port (AOF in <run dir>/up/redis)"
    lines += ["", f"redis: {redis}", f"config: {config_path} (with the ports chosen at start)", ""]
    for name in role_names(rollout, reward, control):
        env = {**gpu_env(plan, name), "STARE_WORKER_NAME": name} if name != "control" else gpu_env(plan, name)
        weights = (
            "none (system.colocate on: each rank's engine takes its weights in process)"
            if plan.colocated
            else f"weight broadcast {s.broadcast_host}:<a free port, announced in Redis> ({s.weight_sync})"
            if s.weight_sync == "broadcast"
            else f"weight sync {s.weight_sync}"
        )
        api = f"API {cfg.control_plane.host}:{cfg.control_plane.port or '<a free port>'} (a free one if taken)"
        ports = {"control": api, "learner": weights}.get(name.split("-")[0], "none")
        lines += [
            f"{name}:",
            f"  command: {' '.join(role_argv(name, config_path))}",
            "  env: " + " ".join(f"{k}={v!r}" if v == "" else f"{k}={v}" for k, v in env.items()),
            f"  ports: {ports}",
        ]
    return "\n".join(lines)


def up(
    cfg: TrainConfig,
    *,
    rollout: int | None,
    reward: int,
    redis_url: str | None,
    control: bool = True,
    gpus: int | None = None,
    learner_gpus: str | None = None,
    rollout_gpus: str | None = None,
    learner_ranks: int | None = None,
    print_plan: bool = False,
    print_compose: Path | None = None,
    command: str = "stare up --print-compose",
    out: TextIO | None = None,
    max_restarts: int = 5,
) -> int:
    """Run the roles (or, with `print_plan`, print them; with `print_compose` = the base
    docker-compose.yml, print the GPU services of compose for the same plan: stare.app.launch.compose)."""
    from stare.plan.gpu_map import parse_gpus

    colocated = node_colocated(cfg)
    if learner_ranks is None and learner_gpus is not None:  # one rank per GPU named
        learner_ranks = len(parse_gpus(learner_gpus, "--learner-gpus"))
    if learner_ranks is None and colocated and cfg.system.learner_ranks == 1:  # they sample: every GPU of the node
        learner_ranks = (node_gpu_count() if gpus is None else gpus) or None
    if learner_ranks is not None:
        cfg = with_overrides(cfg, {"system.learner_ranks": learner_ranks})
    if colocated:
        check_node_colocation(cfg)
    plan = node_plan(cfg, rollout=rollout, gpus=gpus, learner_gpus=learner_gpus, rollout_gpus=rollout_gpus)
    if rollout is None:  # GPUs: one worker per tensor_parallel_size rollout GPUs; CPU: one; colocated: none
        rollout = 0 if colocated else len(plan.rollout) if plan.gpus else 1
    if print_compose is not None:
        if colocated:
            raise ConfigError(
                "--print-compose: the compose services of a node-colocated learner (system.colocate on) "
                "are not generated yet; run it with `stare up` on the node, or set system.colocate=off"
            )
        from stare.app.launch.compose import compose_services, load_templates, render_compose

        doc = compose_services(plan, load_templates(print_compose), reward=reward)
        print(render_compose(doc, plan, command), end="", file=out or sys.stdout)
        return 0
    if print_plan:
        print(
            format_plan(cfg, plan, rollout=rollout, reward=reward, control=control, redis_url=redis_url),
            file=out or sys.stdout,
        )
        return 0
    from reward.verifiers.function import check_functions

    check_functions(cfg.reward)  # here, not in a reward worker's crash loop: one line, exit 2
    return run_until_done(
        ProcessLauncher(
            cfg,
            rollout=rollout,
            reward=reward,
            redis_url=redis_url,
            control=control,
            gpu_plan=plan,
            max_restarts=max_restarts,
        )
    )
