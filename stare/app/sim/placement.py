"""Placement search: the learner/rollout split, max_staleness and data.oversample that maximise modelled
tokens/s/GPU.

For a node of N GPUs, every split with at least one rollout engine whose learner side fits in memory
(`stare plan`'s check, stare/plan/gpu_memory.py) is simulated at each candidate staleness and over-sampling
factor (`stare sim`, a few steps each; the config's own factor is always a candidate); the best is
recommended. `stare plan --node-gpus N` prints it beside the memory plan. Over-sampling raises rollout
work only: the learner's batch, and so its memory, is the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

STALENESS = (0, 1)
# on-policy 1.5 covers dynamic sampling's filtered fraction (2/9 here) in one round almost always; off-policy
# 1.2 widens the window past the filtered groups before the staleness drops grow (docs/performance.md)
OVERSAMPLE = {0: (1.0, 1.5), 1: (1.0, 1.2)}


@dataclass(frozen=True)
class Candidate:
    learner_gpus: int
    max_staleness: int
    oversample: float
    tokens_per_s_per_gpu: float
    s_per_step: float
    bottleneck: str


def search(
    cfg,
    sim,
    *,
    gpus: int,
    gpu: str,
    shape,
    fits: Callable[[int], bool],
    steps: int = 2,
    warmup: int = 1,
    staleness: tuple[int, ...] = STALENESS,
) -> list[Candidate]:
    """Every feasible (learner GPUs, max_staleness, oversample), best first."""
    from stare.app.sim.design import build_design, gpu_costs, lengths_of, simulate

    tp = getattr(cfg.rollout.engine, "tensor_parallel_size", 1)
    out = []
    for learner in range(1, gpus):
        if (gpus - learner) < tp or not fits(learner):
            continue
        for s in staleness:
            for over in sorted({cfg.data.oversample, *OVERSAMPLE.get(min(s, 1), ())}):
                c = cfg.model_copy(deep=True)
                c.system.max_staleness, c.data.oversample = s, over
                design = build_design(c, sim, gpus=gpus, learner_gpus=learner, colocated=False)
                costs = gpu_costs(c, sim, design, shape, gpu)
                _, summary = simulate(c, sim, design, costs, lengths_of(c, sim), steps=steps, warmup=warmup)
                out.append(
                    Candidate(
                        learner, s, over, summary["tokens_per_s_per_gpu"], summary["s_per_step"], summary["bottleneck"]
                    )
                )
    if not out:
        raise ValueError(
            f"no split of {gpus} GPUs fits: the learner needs more memory than {gpus - tp} GPUs give "
            "(stare plan says what to change)"
        )
    return sorted(out, key=lambda c: -c.tokens_per_s_per_gpu)


def render(cands: list[Candidate], gpus: int, gpu: str) -> str:
    best = cands[0]
    lines = [
        f"placement on {gpus} x {gpu} (stare sim, modelled): recommended {best.learner_gpus} learner + "
        f"{gpus - best.learner_gpus} rollout GPUs, max_staleness {best.max_staleness}, data.oversample "
        f"{best.oversample:g}: {best.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, {best.s_per_step:.3g} s/step",
        "  learner  staleness  oversample  tokens/s/GPU  s/step  bottleneck",
    ]
    lines += [
        f"  {c.learner_gpus:>7}  {c.max_staleness:>9}  {c.oversample:>10g}  {c.tokens_per_s_per_gpu:>12,.0f}  "
        f"{c.s_per_step:>6.3g}  {c.bottleneck}"
        for c in cands
    ]
    return "\n".join(lines)


def plan_text(cfg, *, gpus: int, gpu: str, gpu_mem_gib: float, shape, overrides: list[str] = ()) -> str:
    """What `stare plan --node-gpus N` adds: the recommended placement and the config's own prediction."""
    from stare.app.sim.design import SimSettings
    from stare.plan.gpu_memory import build_plan

    sim = SimSettings()
    cands = search(
        cfg,
        sim,
        gpus=gpus,
        gpu=gpu,
        shape=shape,
        fits=lambda n: build_plan(cfg, gpus=n, gpu_mem_gib=gpu_mem_gib, shape=shape).fits,
    )
    own = [
        c
        for c in cands
        if c.learner_gpus == cfg.system.learner_ranks
        and c.max_staleness == cfg.system.max_staleness
        and c.oversample == cfg.data.oversample
    ]
    head = (
        f"predicted as configured ({cfg.system.learner_ranks} learner GPUs, max_staleness "
        f"{cfg.system.max_staleness}, data.oversample {cfg.data.oversample:g}): "
        f"{own[0].tokens_per_s_per_gpu:,.0f} tokens/s/GPU, {own[0].s_per_step:.3g} s/step"
        if own
        else f"as configured ({cfg.system.learner_ranks} learner GPUs): does not fit or leaves no rollout GPU"
    )
    return head + "\n" + render(cands, gpus, gpu)
