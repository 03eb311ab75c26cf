"""Statistics over seeds and samples for `stare compare` and docs/results.md.

Pure functions of numbers, no I/O. With the 3-10 seeds a CPU study affords, the percentile
bootstrap alone overstates certainty (on normal data its nominal 95% interval over 5 seeds covers
about 85%: `bootstrap_coverage`), so every paired difference of the report carries:

- `t_interval`, `t_test_p`: Student's t over the paired differences (exact t distribution for an
  integer number of degrees of freedom: Abramowitz & Stegun 26.7.3-4, `t_cdf`, `t_quantile`);
- `sign_flip_p`: the exact two-sided paired permutation test (every one of the 2^n sign
  assignments), which assumes only that each difference is symmetric about 0 under the null;
  its smallest possible value is 2 / 2^n (0.0625 with 5 seeds);
- `holm`: Holm's step-down adjustment over a family of comparisons (Holm 1979);
- `seeds_for_power`: the number of seeds a paired t-test needs for a given power at the observed
  effect size (noncentral t, integrated numerically: `paired_t_power`);
- `bootstrap_ci`: the mean and a 95% percentile-bootstrap interval (seeds resampled with
  replacement, numpy's PCG64 with a fixed seed, so the interval is the same on every machine),
  kept beside the others.

`pass_at_k`: the unbiased pass@k estimator of Chen et al. 2021 (HumanEval) from n samples of which c
are correct, 1 - C(n - c, k) / C(n, k), computed as a product so it neither overflows nor cancels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
MAX_SIGN_FLIP_N = 22  # 2^22 sign assignments, enumerated in blocks: well under a second
MAX_SEEDS = 10_000  # seeds_for_power searches up to here (None above)


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


def _t_central(t: float, df: int) -> float:
    """P(|T| <= t) for T ~ Student t with integer `df` >= 1, t >= 0 (A&S 26.7.3 odd df, 26.7.4 even)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 0:  # sin(theta) [1 + (1/2) c2 + (1.3)/(2.4) c2^2 + ... up to c2^((df-2)/2)]
        term = total = 1.0
        for k in range(1, (df - 2) // 2 + 1):
            term *= (2 * k - 1) / (2 * k) * c2
            total += term
        return math.sin(theta) * total
    if df == 1:
        return 2.0 * theta / math.pi
    term = total = 1.0  # (2/pi) [theta + sin cos (1 + (2/3) c2 + (2.4)/(3.5) c2^2 + ... up to c2^((df-3)/2))]
    for k in range(1, (df - 3) // 2 + 1):
        term *= (2 * k) / (2 * k + 1) * c2
        total += term
    return 2.0 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with integer `df` >= 1 (exact series, no library)."""
    if df < 1 or int(df) != df:
        raise ValueError(f"t_cdf needs an integer df >= 1, got {df}")
    a = _t_central(abs(t), int(df))
    return 0.5 + 0.5 * a if t >= 0 else 0.5 - 0.5 * a


def t_quantile(q: float, df: int) -> float:
    """The q-quantile of Student's t with integer `df` (bisection on t_cdf to float precision)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"t_quantile needs 0 < q < 1, got {q}")
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < q:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
    return 0.5 * (lo + hi)


def normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _mean_sd(values: Sequence[float]) -> tuple[int, float, float]:
    x = np.asarray([float(v) for v in values], dtype=np.float64)  # [n]
    return x.size, float(x.mean()), float(x.std(ddof=1))


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """(mean, low, high): mean +- t_{(1+level)/2, n-1} sd / sqrt(n). None for fewer than 2 values."""
    if len(values) < 2:
        return None
    n, mean, sd = _mean_sd(values)
    half = t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def t_test_p(values: Sequence[float]) -> float | None:
    """Two-sided p of the one-sample (paired) t-test of mean 0. None for fewer than 2 values; with
    no spread, 1 for a zero mean and 0 otherwise."""
    if len(values) < 2:
        return None
    n, mean, sd = _mean_sd(values)
    if sd == 0.0:
        return 1.0 if mean == 0.0 else 0.0
    return 1.0 - _t_central(abs(mean) / (sd / math.sqrt(n)), n - 1)


def sign_flip_p(values: Sequence[float]) -> float:
    """Exact two-sided paired permutation p-value: the share of the 2^n sign assignments whose
    |sum| is at least the observed |sum| (ties within 1e-12 relative count as at least)."""
    x = np.asarray([float(v) for v in values], dtype=np.float64)  # [n]
    n = x.size
    if n == 0:
        raise ValueError("sign_flip_p needs at least one difference")
    if n > MAX_SIGN_FLIP_N:
        raise ValueError(f"sign_flip_p enumerates 2^n assignments; n = {n} is over {MAX_SIGN_FLIP_N}")
    observed = abs(x.sum()) - 1e-12 * max(1.0, float(np.abs(x).sum()))
    low = min(n, 16)  # the low bits: one [2^low, low] sign matrix, reused for every high-bit pattern
    signs = ((np.arange(1 << low)[:, None] >> np.arange(low)) & 1) * 2.0 - 1.0  # [2^low, low]
    partial = signs @ x[:low]  # [2^low]
    hits = 0
    for high in range(1 << (n - low)):
        rest = sum(x[low + j] * (1.0 if (high >> j) & 1 else -1.0) for j in range(n - low))
        hits += int(np.count_nonzero(np.abs(partial + rest) >= observed))
    return hits / float(1 << n)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order: sorted ascending, the i-th
    (from 0) is max over j <= i of min(1, (m - j) p_(j))."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def paired_t_power(effect: float, n: int, alpha: float = 0.05, points: int = 1001) -> float:
    """Power of the two-sided paired t-test at level `alpha` with n pairs when the differences are
    normal with mean/sd = `effect`: P(|T'| > t_{1-alpha/2, n-1}), T' noncentral t with n - 1
    degrees of freedom and noncentrality effect sqrt(n). Computed as the expectation over
    S = sqrt(V / df), V ~ chi-square(df), of Phi(delta - c S) + Phi(-delta - c S) (Simpson's rule)."""
    if n < 2:
        raise ValueError(f"paired_t_power needs n >= 2 pairs, got {n}")
    df = n - 1
    c = t_quantile(1.0 - alpha / 2.0, df)
    delta = abs(effect) * math.sqrt(n)
    s = np.linspace(0.0, 1.0 + 14.0 / math.sqrt(df), points)  # [P]; the density is ~0 beyond
    log_norm = math.log(2.0) + (df / 2.0) * math.log(df / 2.0) - math.lgamma(df / 2.0)
    safe = np.where(s > 0, s, 1.0)  # [P]; the density at s = 0 is set below
    f = np.exp(log_norm + (df - 1) * np.log(safe) - df * safe * safe / 2.0)  # [P]: S's density
    f[0] = math.exp(log_norm) if df == 1 else 0.0
    phi = np.vectorize(normal_cdf, otypes=[np.float64])  # math.erfc per point: no scipy
    g = (phi(delta - c * s) + phi(-delta - c * s)) * f  # [P]
    h = s[1] - s[0]
    weights = np.ones(points)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return float(min(1.0, h / 3.0 * np.dot(weights, g)))


def seeds_for_power(mean: float, sd: float, power: float = 0.8, alpha: float = 0.05) -> int | None:
    """The smallest number of seeds n >= 2 whose paired t-test (two-sided, `alpha`) reaches `power`
    when the true difference is `mean` with seed-to-seed sd `sd` (the observed ones: a planning
    figure, not a property of the data). None for a zero mean or above MAX_SEEDS."""
    if mean == 0.0:
        return None
    if sd == 0.0:
        return 2
    effect = abs(mean) / sd
    lo, hi = 1, 2  # power(lo) < power <= power(hi), n >= 2
    while paired_t_power(effect, hi, alpha) < power:
        if hi >= MAX_SEEDS:
            return None
        lo, hi = hi, min(2 * hi, MAX_SEEDS)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if paired_t_power(effect, mid, alpha) < power else (lo, mid)
    return hi


def bootstrap_coverage(n: int, level: float = 0.95) -> float:
    """About how often a `level` percentile-bootstrap interval of a mean over n normal values covers
    the true mean: the many-resample limit is mean +- z sd_plugin / sqrt(n), sd_plugin = sd
    sqrt((n - 1) / n), so the coverage is P(|T_{n-1}| <= z sqrt((n - 1) / n)) (ignores the
    bootstrap distribution's discreteness at tiny n)."""
    z = normal_quantile(0.5 + level / 2.0)
    return _t_central(z * math.sqrt((n - 1) / n), n - 1)


def normal_quantile(q: float) -> float:
    """The standard normal q-quantile (bisection on normal_cdf)."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if normal_cdf(mid) < q else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class PairedDiff:
    """The statistics of one paired comparison: n differences (a - b per seed)."""

    n: int
    mean: float
    t_ci: tuple[float, float] | None  # 95% Student t; None for n < 2
    p_t: float | None  # two-sided paired t-test; None for n < 2
    p_sign: float  # exact sign-flip
    boot: tuple[float, float]  # 95% percentile bootstrap
    seeds_80: int | None  # seeds for 80% power at alpha 0.05 (observed mean and sd); None: none found


def paired_diff(diffs: Sequence[float], power: bool = True) -> PairedDiff | None:
    """Every statistic of the report for one set of paired differences; None without any
    (`power` False leaves `seeds_80` None: a per-step cell does not show it)."""
    if not diffs:
        return None
    boot = bootstrap_ci(diffs)
    assert boot is not None
    ci = t_interval(diffs)
    sd = float(np.std(np.asarray(diffs, dtype=np.float64), ddof=1)) if len(diffs) > 1 else None
    return PairedDiff(
        n=len(diffs),
        mean=boot[0],
        t_ci=None if ci is None else (ci[1], ci[2]),
        p_t=t_test_p(diffs),
        p_sign=sign_flip_p(diffs),
        boot=(boot[1], boot[2]),
        seeds_80=None if sd is None or not power else seeds_for_power(boot[0], sd),
    )
