"""Placement search: the learner/rollout split (or the node-colocated learner), max_staleness, data.oversample
and in-flight weight updates that maximise modelled tokens/s/GPU, with the band.

For a node of N GPUs, every split with at least one rollout engine whose learner side fits in memory
(`stare plan`'s check, stare/plan/gpu_memory.py) is simulated at each candidate staleness, over-sampling
factor (the config's own is always a candidate) and, off-policy, with and without in-flight weight updates
(`stare sim` at the central corner, a few steps each). So is the node-colocated learner (`system.colocate:
on`: every GPU a learner rank whose engine sleeps while it steps) at the largest `gpu_memory_utilization`
its memory plan fits (stare/plan/colocation.py `build_node_plan`), when the product runs it for this config
(`check_node_colocation`: one GPU per engine, no tool loop; never with in-flight updates). The leading candidates (the best four and any within
10% of the best) are simulated at the pessimistic and optimistic corners too; the recommendation is the
design best at every corner, or the answer says that the band cannot separate the leaders and where each
wins (stare/app/sim/bands.py). `stare plan --node-gpus N` prints it beside the memory plan. Over-sampling
raises rollout work only: the learner's batch, and so its memory, is the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

STALENESS = (0, 1)
# on-policy 1.5 covers dynamic sampling's filtered fraction (2/9 here) in one round almost always; off-policy
# 1.2 widens the window past the filtered groups before the staleness drops grow (docs/performance.md)
OVERSAMPLE = {0: (1.0, 1.5), 1: (1.0, 1.2)}


@dataclass
class Candidate:
    learner_gpus: int
    max_staleness: int
    oversample: float
    tokens_per_s_per_gpu: float  # at the central corner
    s_per_step: float
    bottleneck: str
    inflight: bool = False
    corners: dict[str, float] = field(default_factory=dict)  # tokens/s/GPU by corner (leaders only)
    colocated_gmu: float | None = None  # the node-colocated learner on every GPU, at this gpu_memory_utilization

    @property
    def name(self) -> str:
        head = (
            f"colocated on {self.learner_gpus} (gpu_memory_utilization {self.colocated_gmu:g})"
            if self.colocated_gmu is not None
            else f"{self.learner_gpus} learner"
        )
        return f"{head}, max_staleness {self.max_staleness}, oversample {self.oversample:g}" + (
            ", in-flight" if self.inflight else ""
        )


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
    bands: bool = True,
    colocated_gmu: float | None = None,
) -> list[Candidate]:
    """Every feasible (learner GPUs, max_staleness, oversample, in-flight), best first at the central corner;
    the leaders carry their tokens/s/GPU at every corner (`bands`). `colocated_gmu`: the node-colocated
    learner is a candidate too, at that gpu_memory_utilization (None: it is not, as when it does not fit)."""
    from stare.app.sim.design import build_design, gpu_costs, lengths_of, simulate
    from stare.config import ConfigError

    tp = getattr(cfg.rollout.engine, "tensor_parallel_size", 1)
    out, configs = [], []

    def add(learner: int, s: int, over: float, inflight: bool, gmu: float | None) -> None:
        c = cfg.model_copy(deep=True)
        c.system.max_staleness, c.data.oversample = s, over
        c.system.inflight_weight_updates = inflight
        if gmu is not None:
            c.system.colocate = "on"
            c.rollout.engine.gpu_memory_utilization = gmu  # type: ignore[union-attr]
        design = build_design(c, sim, gpus=gpus, learner_gpus=learner, colocated=gmu is not None)
        costs = gpu_costs(c, sim, design, shape, gpu)
        try:
            _, summary = simulate(c, sim, design, costs, lengths_of(c, sim), steps=steps, warmup=warmup)
        except ConfigError:  # a colocated node the product refuses for this config (check_node_colocation)
            if gmu is None:
                raise
            return
        central = summary["tokens_per_s_per_gpu"]
        out.append(
            Candidate(
                learner,
                s,
                over,
                central,
                summary["s_per_step"],
                summary["bottleneck"],
                inflight,
                {"central": central},
                gmu,
            )
        )
        configs.append((c, design))

    for learner in range(1, gpus):
        if (gpus - learner) < tp or not fits(learner):
            continue
        for s in staleness:
            for over in sorted({cfg.data.oversample, *OVERSAMPLE.get(min(s, 1), ())}):
                for inflight in (False, True) if s > 0 else (False,):
                    add(learner, s, over, inflight, None)
    if colocated_gmu is not None and gpus > 1:
        for s in staleness:
            for over in sorted({cfg.data.oversample, *OVERSAMPLE.get(min(s, 1), ())}):
                add(gpus, s, over, False, colocated_gmu)
    if not out:
        raise ValueError(
            f"no split of {gpus} GPUs fits: the learner needs more memory than {gpus - tp} GPUs give "
            "(stare plan says what to change)"
        )
    order = sorted(range(len(out)), key=lambda i: -out[i].tokens_per_s_per_gpu)
    if bands:
        best = out[order[0]].tokens_per_s_per_gpu
        leaders = [i for n, i in enumerate(order) if n < 4 or out[i].tokens_per_s_per_gpu >= 0.9 * best]
        for i in leaders:
            c, design = configs[i]
            for corner in ("pessimistic", "optimistic"):
                costs = gpu_costs(c, sim, design, shape, gpu, corner)
                _, summary = simulate(c, sim, design, costs, lengths_of(c, sim), steps=steps, warmup=warmup)
                out[i].corners[corner] = summary["tokens_per_s_per_gpu"]
    return [out[i] for i in order]


def recommendation(cands: list[Candidate]) -> str:
    """Which design wins across the band, or that the band cannot separate the leaders."""
    from stare.app.sim.bands import verdict

    banded = {c.name: c.corners for c in cands if len(c.corners) == 3}
    return verdict(banded) if banded else f"{cands[0].name} (central corner only)"


def render(cands: list[Candidate], gpus: int, gpu: str) -> str:
    best = cands[0]

    def band(c: Candidate) -> str:
        if len(c.corners) < 3:
            return ""
        return f" [{c.corners['pessimistic']:,.0f}, {c.corners['optimistic']:,.0f}]"

    where = (
        f"the node-colocated learner on all {gpus} GPUs (system.colocate on, rollout.engine.gpu_memory_utilization "
        f"{best.colocated_gmu:g})"
        if best.colocated_gmu is not None
        else f"{best.learner_gpus} learner + {gpus - best.learner_gpus} rollout GPUs"
    )
    lines = [
        f"placement on {gpus} x {gpu} (stare sim, modelled): recommended {where}, max_staleness "
        f"{best.max_staleness}, data.oversample {best.oversample:g}{', in-flight weight updates' if best.inflight else ''}: "
        f"{best.tokens_per_s_per_gpu:,.0f}{band(best)} tokens/s/GPU, {best.s_per_step:.3g} s/step",
        f"across the band: {recommendation(cands)}",
        "  learner  staleness  oversample  in-flight  tokens/s/GPU [low, high]  s/step  bottleneck",
    ]
    lines += [
        f"  {c.learner_gpus if c.colocated_gmu is None else 'coloc':>7}  {c.max_staleness:>9}  {c.oversample:>10g}  {'yes' if c.inflight else 'no':>9}  "
        f"{c.tokens_per_s_per_gpu:>12,.0f}{band(c):<14}  {c.s_per_step:>6.3g}  {c.bottleneck}"
        for c in cands
    ]
    coloc = next((c for c in cands if c.colocated_gmu is not None), None)
    if coloc is not None:
        lines.append(
            f"  coloc: the node-colocated learner on all {gpus} GPUs (system.colocate on, no in-flight updates), "
            f"rollout.engine.gpu_memory_utilization {coloc.colocated_gmu:g}: the largest its memory plan fits"
        )
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
        colocated_gmu=colocated_gmu(cfg, gpus=gpus, gpu_mem_gib=gpu_mem_gib, shape=shape),
    )
    own = [
        c
        for c in cands
        if (c.colocated_gmu is not None) == (cfg.system.colocate == "on")
        and (c.colocated_gmu is not None or c.learner_gpus == cfg.system.learner_ranks)
        and c.max_staleness == cfg.system.max_staleness
        and c.oversample == cfg.data.oversample
        and c.inflight == cfg.system.inflight_weight_updates
    ]
    head = (
        f"predicted as configured ({_configured(cfg, own[0], gpus)}, max_staleness "
        f"{cfg.system.max_staleness}, data.oversample {cfg.data.oversample:g}): "
        f"{own[0].tokens_per_s_per_gpu:,.0f} tokens/s/GPU, {own[0].s_per_step:.3g} s/step"
        if own
        else (
            "as configured (the node-colocated learner): the product refuses it for this config, or its memory plan "
            f"fits at no rollout.engine.gpu_memory_utilization of {GMU_GRID[-1]:g}-{GMU_GRID[0]:g} (stare plan --gpus "
            f"{gpus} --set system.colocate=on says what to change)"
            if cfg.system.colocate == "on"
            else f"as configured ({cfg.system.learner_ranks} learner GPUs): does not fit or leaves no rollout GPU"
        )
    )
    return head + "\n" + render(cands, gpus, gpu)


def _configured(cfg, own: Candidate, gpus: int) -> str:
    if own.colocated_gmu is None:
        return f"{cfg.system.learner_ranks} learner GPUs"
    return f"the node-colocated learner on {gpus} GPUs, modelled at gpu_memory_utilization {own.colocated_gmu:g}"


GMU_GRID = tuple(round(0.95 - 0.05 * i, 2) for i in range(14))  # 0.95 down to 0.3


def colocated_gmu(cfg, *, gpus: int, gpu_mem_gib: float, shape) -> float | None:
    """The largest rollout.engine.gpu_memory_utilization (of 0.95, 0.9, ..., 0.3) at which the node-colocated
    learner's memory plan fits on `gpus` GPUs (both phases: the step with the engine asleep, sampling beside
    the resident learner); None when none does, the engine is not vLLM, or there is one GPU."""
    from stare.plan.colocation import build_node_plan

    if gpus < 2 or cfg.rollout.engine.name != "vllm":
        return None
    for gmu in GMU_GRID:
        c = cfg.model_copy(deep=True)
        c.system.colocate = "on"
        c.rollout.engine.gpu_memory_utilization = gmu
        if all(r.fits for r in build_node_plan(c, gpus=gpus, gpu_mem_gib=gpu_mem_gib, shape=shape).roles):
            return gmu
    return None
