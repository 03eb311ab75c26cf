"""Statistics over seeds and samples for `stare compare` and docs/results.md.

`bootstrap_ci`: the mean of per-seed values and a 95% percentile-bootstrap interval (seeds resampled
with replacement, numpy's PCG64 with a fixed seed, so the interval is the same on every machine).
`pass_at_k`: the unbiased pass@k estimator of Chen et al. 2021 (HumanEval) from n samples of which c
are correct, 1 - C(n - c, k) / C(n, k), computed as a product so it neither overflows nor cancels.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def bootstrap_ci(
    values: Sequence[float], *, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float, float] | None:
    """(mean, low, high): the mean of `values` and the `level` percentile-bootstrap interval of the
    mean (quantiles by the inverted empirical CDF, so the bounds are resampled means). None without
    values; one value gives a zero-width interval (nothing to resample)."""
    x = np.asarray([float(v) for v in values], dtype=np.float64)  # [m]
    if x.size == 0:
        return None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(resamples, x.size))  # [B, m]
    means = x[idx].mean(axis=1)  # [B]
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail], method="inverted_cdf")
    return float(x.mean()), float(low), float(high)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem from n samples with c correct (k <= n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    i = np.arange(n - c + 1, n + 1, dtype=np.float64)  # [c]
    return float(1.0 - np.prod(1.0 - k / i))


def pass_at_k_curve(counts: Sequence[Sequence[int]], ks: Sequence[int]) -> list[float | None]:
    """Mean pass@k over problems for each k, from [n, c] per problem; None for a k above some n."""
    out: list[float | None] = []
    for k in ks:
        if not counts or any(k > n for n, _ in counts):
            out.append(None)
            continue
        out.append(sum(pass_at_k(n, c, k) for n, c in counts) / len(counts))
    return out
