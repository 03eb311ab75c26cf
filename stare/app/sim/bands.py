"""Bands: a design simulated at the cost model's three corners (stare/app/sim/constants.py), and a comparison of
designs that says when the band cannot separate them.

Designs share the constants, so they are compared corner by corner: a design wins across the band when it is
the best at every corner; otherwise the answer names the corners at which each wins.
"""

from __future__ import annotations

from typing import Any

from stare.app.sim.constants import CORNERS


def simulate_band(cfg, sim, design, shape, gpu_name: str, *, steps: int, warmup: int, corners=CORNERS):
    """{corner: (run, summary)} of one design (the same seed at every corner)."""
    from stare.app.sim.design import gpu_costs, lengths_of, simulate

    out = {}
    for corner in corners:
        costs = gpu_costs(cfg, sim, design, shape, gpu_name, corner)
        out[corner] = simulate(cfg, sim, design, costs, lengths_of(cfg, sim), steps=steps, warmup=warmup)
    return out


def winner(figures: dict[str, dict[str, float]]) -> tuple[str | None, dict[str, str]]:
    """`figures`: design name -> {corner: tokens/s/GPU}. (the design best at every corner or None, the best
    design at each corner)."""
    corners = sorted({c for by in figures.values() for c in by}, key=CORNERS.index)
    best = {c: max(figures, key=lambda name: figures[name].get(c, float("-inf"))) for c in corners}
    names = set(best.values())
    return (names.pop() if len(names) == 1 else None), best


def verdict(figures: dict[str, dict[str, float]]) -> str:
    """One line: which design wins across the band, or that the band cannot separate them and where each wins."""
    win, best = winner(figures)
    if win is not None:
        return f"{win} is the best at every corner of the band"
    parts = "; ".join(
        f"{name} at the {', '.join(c for c, n in best.items() if n == name)} corner"
        for name in dict.fromkeys(best.values())
    )
    return f"the band cannot separate the designs: best {parts}"


def corner_figures(band: dict[str, tuple[Any, dict]]) -> dict[str, float]:
    return {c: summary["tokens_per_s_per_gpu"] for c, (_, summary) in band.items()}
