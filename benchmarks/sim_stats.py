"""The simulator's statistics: the pool audit of a simulated end state and the bootstrap summary
of a figure over seeds (numpy and the rules only, so the simulator and its figures share them)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from prioreplay.rules import Pool


def pool_misfiled_share(dump: dict[str, Any], success: np.ndarray, G: int, rng: np.random.Generator) -> float:
    """The pool audit (docs/METHOD.md, "How a default is chosen") on a simulated run's end state: every problem
    in the solved or unsolved pool is scored with G fresh Bernoulli(p_j) draws of the final policy
    (``success``, (N,)); misfiled: unsolved with p̂ >= 1/G, or solved with p̂ <= 1 − 1/G (the
    problem would give a mixed group, or has been solved, if tested now). NaN when both pools
    are empty. Ids are ``p<index>`` (:func:`problem_records`); ``rng`` is the audit's own."""
    pooled = sorted((int(pid[1:]), pool) for pid, (pool, *_) in dump["problems"].items() if pool in (Pool.SOLVED, Pool.UNSOLVED))
    if not pooled:
        return math.nan
    idx = np.array([j for j, _ in pooled])  # (P,)
    unsolved = np.array([pool == Pool.UNSOLVED for _, pool in pooled])  # (P,)
    phat = (rng.random((idx.size, G)) < success[idx][:, None]).mean(axis=1)  # (P,)
    wrong = np.where(unsolved, phat >= 1.0 / G, phat <= 1.0 - 1.0 / G)
    return float(wrong.mean())


def summarize(values: Sequence[float], seed: int = 0, resamples: int = 10_000) -> dict[str, float]:
    """Mean and 95% percentile-bootstrap interval of the mean (NaNs dropped; ``n`` counts the rest).

    Returns:
        {"mean", "lo", "hi", "n"}; mean/lo/hi are NaN when no value is finite.
    """
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"mean": math.nan, "lo": math.nan, "hi": math.nan, "n": 0}
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": float(x.mean()), "lo": float(lo), "hi": float(hi), "n": int(x.size)}
