"""`stare sim`'s bands: the three corners of the cost model order throughput, and a recommendation says when the
band cannot separate two designs."""

from __future__ import annotations

from sim_helpers import TINY, tiny

from stare.app.sim.bands import verdict, winner


def test_the_corners_order_throughput_on_the_tiny_node():
    from stare.app.sim.bands import simulate_band
    from stare.app.sim.design import build_design
    from stare.app.sim.report import band_of

    cfg, sim = tiny()
    design = build_design(cfg, sim, gpus=2, learner_gpus=1, colocated=False)
    band = simulate_band(cfg, sim, design, TINY, "h100-80gb", steps=2, warmup=1)
    tps = {c: s["tokens_per_s_per_gpu"] for c, (_, s) in band.items()}
    assert tps["pessimistic"] < tps["central"] < tps["optimistic"]
    summary = band_of({c: s for c, (_, s) in band.items()})
    assert summary["band"]["tokens_per_s_per_gpu"] == [tps["pessimistic"], tps["optimistic"]]
    assert summary["band"]["s_per_step"][0] <= summary["s_per_step"] <= summary["band"]["s_per_step"][1]


def test_a_design_best_at_every_corner_wins_across_the_band():
    figures = {
        "A": {"pessimistic": 900, "central": 1000, "optimistic": 1100},
        "B": {"pessimistic": 800, "central": 950, "optimistic": 1050},
    }
    assert winner(figures) == ("A", {"pessimistic": "A", "central": "A", "optimistic": "A"})
    assert verdict(figures) == "A is the best at every corner of the band"


def test_designs_that_cross_inside_the_band_are_not_separated():
    figures = {
        "A": {"pessimistic": 700, "central": 1000, "optimistic": 1300},
        "B": {"pessimistic": 800, "central": 950, "optimistic": 1050},
    }
    assert winner(figures)[0] is None
    assert verdict(figures) == (
        "the band cannot separate the designs: best B at the pessimistic corner; A at the central, optimistic corner"
    )
