"""Rollouts to target: how many rollouts an arm needs to reach the held-out accuracy a baseline
reaches with its whole budget, read off learning curves (pure: no I/O, standard library only).

The figure the published anchors report (Pilot-Commit, arXiv 2605.26606; GRESO, arXiv 2506.02177)
and issue "the method against the right baselines" asks for:

1. The **target** of a seed is the held-out accuracy the baseline arm (``grpo``: plain GRPO, every
   group in the batch) reaches at its budget R: the last point of its curve, or, when every arm
   runs to 2R so that a plateau shows, its curve read at R (``target_at``). It is fixed by the
   baseline's run, before any other arm is read.
2. Each arm's **rollouts to target** is the first crossing of that accuracy on its curve, linearly
   interpolated between the two evaluation points around it (:func:`first_crossing`). The
   baseline's own figure is the crossing on its own curve (at most its budget: it may cross
   earlier and fall back).
3. The **ratio** of a seed is baseline rollouts / arm rollouts (> 1: the arm needs fewer). Seeds are
   paired (same model, data, seed, held-out problems); the interval is a percentile bootstrap
   of the ratio of mean rollouts over seeds resampled in pairs (:func:`rollouts_to_target_ratio`).

A curve that never reaches the target is **censored**: the arm needed more than its last
evaluated rollouts, so its last point is used (an upper bound on its ratio) and the seed is
counted in ``censored``. Curves should have at least :data:`MIN_EVAL_POINTS` points, or the
interpolation is too coarse to read (the function refuses fewer).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Fewest evaluation points a curve must have (the issue's rule: "≥ 5 points per run").
MIN_EVAL_POINTS = 5


@dataclass(frozen=True)
class Curve:
    """Held-out accuracy of one run against the rollouts consumed when it was measured.

    Attributes:
        rollouts: completions generated at each evaluation, ascending (>= 0).
        accuracy: held-out accuracy at each evaluation, in [0, 1], same length.

    Raises:
        ValueError: lengths differ, fewer than :data:`MIN_EVAL_POINTS` points, rollouts not
            ascending, or a value that is not finite (the message names it).
    """

    rollouts: tuple[float, ...]
    accuracy: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.rollouts) != len(self.accuracy):
            raise ValueError(f"a curve needs one accuracy per rollout count ({len(self.rollouts)} vs {len(self.accuracy)})")
        if len(self.rollouts) < MIN_EVAL_POINTS:
            raise ValueError(
                f"a curve has {len(self.rollouts)} evaluation points; rollouts to target needs >= {MIN_EVAL_POINTS} "
                "(evaluate the held-out set more often)"
            )
        for name, vals in (("rollouts", self.rollouts), ("accuracy", self.accuracy)):
            bad = [v for v in vals if not math.isfinite(v)]
            if bad:
                raise ValueError(f"curve {name} holds a non-finite value ({bad[0]!r})")
        if any(b < a for a, b in zip(self.rollouts, self.rollouts[1:], strict=False)):
            raise ValueError("curve rollouts must be ascending (one evaluation after another)")

    @property
    def final(self) -> float:
        """Accuracy at the last evaluation (the full budget)."""
        return self.accuracy[-1]

    def at(self, rollouts: float) -> float:
        """Accuracy at ``rollouts`` by linear interpolation (the end values outside the curve)."""
        xs, ys = self.rollouts, self.accuracy
        if rollouts <= xs[0]:
            return ys[0]
        for i in range(1, len(xs)):
            if rollouts <= xs[i]:
                x0, x1 = xs[i - 1], xs[i]
                return ys[i] if x1 == x0 else ys[i - 1] + (ys[i] - ys[i - 1]) * (rollouts - x0) / (x1 - x0)
        return ys[-1]


def first_crossing(curve: Curve, target: float) -> tuple[float, bool]:
    """The rollouts at which ``curve`` first reaches ``target``, linearly interpolated.

    Returns:
        (rollouts, reached). When the first point already reaches it, its rollouts; when no point
        does, (last rollouts, False): censored, the run needed more than it had.
    """
    xs, ys = curve.rollouts, curve.accuracy
    if ys[0] >= target:
        return xs[0], True
    for i in range(1, len(xs)):
        if ys[i] >= target:
            y0, y1 = ys[i - 1], ys[i]
            return xs[i - 1] + (xs[i] - xs[i - 1]) * (target - y0) / (y1 - y0), True
    return xs[-1], False


@dataclass(frozen=True)
class RatioResult:
    """An arm's rollouts to target against a baseline over paired seeds.

    Attributes:
        ratio: Σ baseline rollouts / Σ arm rollouts over the seeds (> 1: the arm needs fewer).
        ci_low, ci_high: 95% paired percentile bootstrap over seeds (NaN with one seed).
        per_seed: baseline / arm per seed, in seed order.
        seeds: the paired seeds, ascending.
        censored: seeds where the arm never reached the target (its ratio is an upper bound).
        targets: the target accuracy of each seed.
        no_gain: seeds left out because the baseline reached the target before training (its
            accuracy at its budget is no better than at its first evaluation: nothing to reach).
    """

    ratio: float
    ci_low: float
    ci_high: float
    per_seed: tuple[float, ...]
    seeds: tuple[int, ...]
    censored: int
    targets: tuple[float, ...]
    no_gain: tuple[int, ...] = ()


def rollouts_to_target_ratio(
    arm: Mapping[int, Curve],
    base: Mapping[int, Curve],
    target_from: Mapping[int, Curve] | None = None,
    *,
    target_at: Mapping[int, float] | None = None,
    resamples: int = 10_000,
    seed: int = 0,
) -> RatioResult:
    """Rollouts to target of ``arm`` against ``base`` on the seeds both have (paired).

    Args:
        arm, base: each arm's curve by seed.
        target_from: the curves whose final accuracy is each seed's target (default ``base``:
            the baseline's accuracy at its full budget). Pass the ``grpo`` curves to measure an
            arm against ``dapo`` at ``grpo``'s target.
        target_at: per seed, the rollouts at which ``target_from``'s accuracy is the target
            (interpolated, :meth:`Curve.at`) instead of its last point: with every arm run to 2R,
            ``{seed: R}`` makes the target what the baseline reaches at R (the issue's design:
            the second half of each curve shows a plateau). A seed missing from it uses the last point.
        resamples: bootstrap resamples; seed: seeds the bootstrap.

    Returns:
        :class:`RatioResult`. Its ratio is Σ base / Σ arm (the ratio of mean rollouts), which is
        not dominated by one seed's small denominator as a mean of per-seed ratios would be.

    A seed whose baseline reaches the target at its first evaluation (no gain over the start) is
    left out and listed in ``no_gain``; with none left the figures are NaN.

    Raises:
        ValueError: no seed is common to ``arm``, ``base`` and ``target_from``.
    """
    ref = base if target_from is None else target_from
    seeds = tuple(sorted(set(arm) & set(base) & set(ref)))
    if not seeds:
        raise ValueError(f"no common seed: arm {sorted(arm)}, baseline {sorted(base)}, target {sorted(ref)}")
    a_r, b_r, censored, kept, no_gain = [], [], 0, [], []
    at = target_at or {}

    def target(s: int) -> float:
        return ref[s].at(at[s]) if s in at else ref[s].final

    for s in seeds:
        t = target(s)
        rb, _ = first_crossing(base[s], t)
        if rb <= 0.0:  # the baseline was there before training: no rollouts to compare
            no_gain.append(s)
            continue
        ra, reached = first_crossing(arm[s], t)
        censored += not reached
        a_r.append(max(ra, 1e-9))
        b_r.append(rb)
        kept.append(s)
    seeds, targets = tuple(kept), tuple(target(s) for s in kept)
    if not seeds:
        return RatioResult(math.nan, math.nan, math.nan, (), (), 0, (), tuple(no_gain))
    ratio = sum(b_r) / sum(a_r)
    lo = hi = math.nan
    if len(seeds) > 1:
        rng = random.Random(seed)
        n = len(seeds)
        draws = []
        for _ in range(resamples):
            idx = [rng.randrange(n) for _ in range(n)]
            draws.append(sum(b_r[i] for i in idx) / sum(a_r[i] for i in idx))
        draws.sort()
        lo, hi = draws[int(0.025 * (resamples - 1))], draws[int(0.975 * (resamples - 1))]
    return RatioResult(
        ratio=ratio,
        ci_low=lo,
        ci_high=hi,
        per_seed=tuple(b / a for a, b in zip(a_r, b_r, strict=True)),
        seeds=seeds,
        censored=censored,
        targets=targets,
        no_gain=tuple(no_gain),
    )


def accuracy_at(curves: Mapping[int, Curve], rollouts: float) -> list[float]:
    """Each seed's accuracy at ``rollouts`` (interpolated), in seed order: e.g. every arm at
    twice the baseline's budget, where a plateau shows."""
    return [curves[s].at(rollouts) for s in sorted(curves)]


def curves_from_points(points: Sequence[tuple[float, float]]) -> Curve:
    """A :class:`Curve` from (rollouts, accuracy) pairs, sorted by rollouts."""
    pts = sorted(points)
    return Curve(tuple(p[0] for p in pts), tuple(p[1] for p in pts))
