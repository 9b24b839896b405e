"""95% intervals for the figures a run reports: one proportion, a paired difference, a ratio.

* :func:`wilson`: a proportion k/n (Wilson 1927 score interval), e.g. held-out accuracy.
* :func:`paired_difference`: the change of accuracy on the same held-out problems before and
  after training (Newcombe 1998, "Improved confidence intervals for the difference between
  binomial proportions based on paired data", Statistics in Medicine 17:2635, method 10: the
  Wilson limits of each proportion combined with the continuity-corrected phi correlation of
  the pairs).
* :func:`bootstrap_ratio`: the ratio of two arms' means across seeds (percentile bootstrap over
  seeds, each arm resampled on its own), e.g. heap's effective-group fraction over uniform's.
* :func:`mean_interval`: a mean over seeds with its Student-t interval; :func:`ratio_interval`:
  per-seed ratios (e.g. rollouts to target, baseline over arm) as a geometric mean with the
  t-interval of their mean log, exponentiated.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

Z95 = 1.959963984540054  # the 97.5% quantile of the standard normal


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of the proportion ``k / n``.

    Returns:
        (low, high) in [0, 1]; (0.0, 1.0) when n == 0.

    Raises:
        ValueError: k < 0, n < 0 or k > n.
    """
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"wilson(k={k}, n={n}) needs 0 <= k <= n")
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference(before: Sequence[bool], after: Sequence[bool], z: float = Z95) -> tuple[float, float, float]:
    """Difference of two paired proportions, ``mean(after) - mean(before)``, with its interval.

    Args:
        before, after: per-problem correctness on the same problems, same order.

    Returns:
        (difference, low, high), each in [-1, 1] (Newcombe 1998, method 10).

    Raises:
        ValueError: the sequences are empty or differ in length.
    """
    n = len(before)
    if n == 0 or n != len(after):
        raise ValueError(f"paired_difference needs two non-empty sequences of one length (got {n} and {len(after)})")
    a = sum(1 for x, y in zip(after, before, strict=True) if x and y)  # right both times
    b = sum(1 for x, y in zip(after, before, strict=True) if x and not y)  # right only after
    c = sum(1 for x, y in zip(after, before, strict=True) if not x and y)  # right only before
    d = n - a - b - c
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson(a + b, n, z)
    l2, u2 = wilson(a + c, n, z)
    marg = (a + b) * (c + d) * (a + c) * (b + d)
    cross: float = a * d - b * c  # phi's numerator with Newcombe's continuity correction (method 10)
    cross = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0.0)
    phi = cross / math.sqrt(marg) if marg else 0.0
    diff = p1 - p2
    delta = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    eps = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return diff, max(-1.0, diff - delta), min(1.0, diff + eps)


def bootstrap_ratio(
    num: Sequence[float], den: Sequence[float], resamples: int = 10_000, seed: int = 0, paired: bool = False
) -> tuple[float, float, float]:
    """Ratio of means ``mean(num) / mean(den)`` with a percentile-bootstrap 95% interval.

    Each arm's values (one per seed) are resampled with replacement on their own, or, with
    ``paired`` (``num[i]`` and ``den[i]`` share seed i: same data, held-out slice and worker
    seeds), the seeds are resampled jointly. With a single value per arm the interval collapses
    to the point (no spread can be measured from one seed).

    Returns:
        (ratio, low, high); ``inf`` where a denominator mean is 0.

    Raises:
        ValueError: an empty sequence.
    """
    if not num or not den:
        raise ValueError("bootstrap_ratio needs at least one value per arm")

    def ratio(x: Sequence[float], y: Sequence[float]) -> float:
        my = sum(y) / len(y)
        return (sum(x) / len(x)) / my if my else math.inf

    if paired and len(num) != len(den):
        raise ValueError(f"paired bootstrap needs as many values in each arm (got {len(num)} and {len(den)})")
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        if paired:
            idx = rng.choices(range(len(num)), k=len(num))
            draws.append(ratio([num[i] for i in idx], [den[i] for i in idx]))
        else:
            draws.append(ratio(rng.choices(num, k=len(num)), rng.choices(den, k=len(den))))
    draws.sort()
    return ratio(num, den), draws[int(0.025 * (resamples - 1))], draws[int(math.ceil(0.975 * (resamples - 1)))]


#: Student's t 97.5% quantiles for 1..30 degrees of freedom (beyond: the normal quantile).
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean of ``values`` (one per seed) with its 95% Student-t interval (mean ± t·s/√n); the
    interval is the point itself for one value.

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("mean_interval needs at least one value")
    n = len(values)
    m = sum(values) / n
    if n == 1:
        return m, m, m
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    t = t975(n - 1)
    return m, m - t * s / math.sqrt(n), m + t * s / math.sqrt(n)


def t975(df: int) -> float:
    """Student's t 97.5% quantile for ``df`` >= 1 degrees of freedom (the normal's beyond 30).

    Raises:
        ValueError: ``df`` < 1.
    """
    if df < 1:
        raise ValueError(f"degrees of freedom ({df}) must be >= 1")
    return _T975[df - 1] if df <= len(_T975) else Z95


def ratio_interval(ratios: Sequence[float]) -> tuple[float, float, float]:
    """Per-seed ratios summarised on the log scale: exp(mean log r) with exp(mean ± t·s/√n).

    A ratio and its reciprocal are treated alike (log r is symmetric where r/(1/r) is not), so
    identical arms give a centre near 1 whichever is the numerator; the t quantile has n − 1
    degrees of freedom (:func:`mean_interval`). One ratio gives the point as its own interval.

    Returns:
        (geometric mean, low, high).

    Raises:
        ValueError: no ratios, or a ratio that is not finite and > 0 (its log is undefined).
    """
    if not ratios:
        raise ValueError("ratio_interval needs at least one ratio")
    bad = [r for r in ratios if not (math.isfinite(r) and r > 0)]
    if bad:
        raise ValueError(f"ratio_interval needs finite ratios > 0 (got {bad[0]!r}); leave out seeds without a ratio")
    m, lo, hi = mean_interval([math.log(r) for r in ratios])
    return math.exp(m), math.exp(lo), math.exp(hi)
