"""Shared by the benchmark tests: the structure every result row must have."""

from __future__ import annotations

import math
import statistics

from stare.app.bench.common import ROW_KEYS


def check_rows(rows: list[dict], names: list[str]) -> dict[str, dict]:
    """Rows named `names` (in order), each complete; measured ones finite, positive and
    self-consistent (ratio = ours / baseline, or the median of the per-repeat ratios or of the per-call
    ratios, pass agrees with the target). Returns them by name.
    Targets are not checked: a unit test cannot promise a speed."""
    assert [r["name"] for r in rows] == names
    for r in rows:
        assert set(ROW_KEYS) <= set(r), f"{r['name']}: missing {set(ROW_KEYS) - set(r)}"
        assert isinstance(r["what"], str) and r["what"] and isinstance(r["unit"], str)
        assert not r.get("error"), r.get("error")
        if r.get("skipped"):
            assert r["ours"] is None and r["ratio"] is None and r["pass"] is None
            continue
        for key in ("ours", "baseline", "ratio"):
            assert math.isfinite(r[key]) and r[key] > 0, f"{r['name']}: {key}={r[key]}"
        lo, hi = r["spread"]
        assert math.isfinite(lo) and math.isfinite(hi) and 0 <= lo <= hi
        if r.get("ratio_of") == "pairs":  # the median of the per-repeat ratios
            pairs = [o / b for o, b in zip(r["samples"]["ours"], r["samples"]["baseline"])]
            assert math.isclose(r["ratio"], statistics.median(pairs), rel_tol=1e-12) and lo <= r["ratio"] <= hi
        elif r.get("ratio_of") == "call pairs":  # the median over every pair of calls; spread: the rounds' medians
            medians = r["samples"]["round_median_ratios"]
            assert [lo, hi] == [min(medians), max(medians)] and len(medians) == r["repeats"]
            assert lo * (1 - 1e-12) <= r["ratio"] <= hi * (1 + 1e-12) and r["pairs"] >= r["repeats"]
        else:
            assert math.isclose(r["ratio"], r["ours"] / r["baseline"], rel_tol=1e-12)
        if r["target"] is None:
            assert r["pass"] is None
        else:
            assert r["pass"] is (r["ratio"] >= r["target"] if r["higher_is_better"] else r["ratio"] <= r["target"])
    return {r["name"]: r for r in rows}
