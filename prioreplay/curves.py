"""Rollouts to target: how many rollouts an arm needs to reach a held-out accuracy, read off
learning curves, against a baseline's (pure: no I/O, standard library only).

The figure the published anchors report (Pilot-Commit, arXiv 2605.26606; GRESO, arXiv 2506.02177).
Per seed (every arm of a seed shares model, data and held-out problems):

1. The **target** is a held-out accuracy fixed independently of the two curves compared
   (:func:`ratio_to_target`'s ``targets``): an accuracy written down before the runs
   (:func:`fixed_targets`), or the mean accuracy at R of the baseline's *other* seeds
   (:func:`leave_one_out_targets`: seed s's target never reads seed s's curves).
2. Each arm's **rollouts to target** is the first crossing of that accuracy on its curve, linearly
   interpolated between the two evaluation points around it (:func:`first_crossing`).
3. The **ratio** of a seed is baseline rollouts / arm rollouts (> 1: the arm needs fewer); over
   seeds the figure is the geometric mean with the Student-t interval of the mean log ratio
   (:func:`prioreplay.intervals.ratio_interval`), symmetric for identical arms.

A curve that never reaches the target is **censored**: its crossing is taken at its last
evaluation, so that seed's ratio is a bound (an upper bound when the arm is censored, a lower one
when the baseline is), and :class:`TargetRatio` lists the seeds and says which way the figure is
bounded. A seed where neither curve reaches the target, or one already reaches it before
training, has no ratio and is listed as left out.

**Why not the baseline's own accuracy at R** (:func:`rollouts_to_target_ratio`, the estimator the
simulator's ``method.rollouts_to_target.*`` figures were made with): the baseline's own first
crossing of the value its noisy curve shows at R lies at or before R by construction, while
another arm's crossing of it scatters on both sides, so identical arms measure below 1 (median
about 0.85 with 64-problem evaluations; ``method.estimator.*`` in benchmarks/RESULTS.md). It is
kept for those figures (noise-free simulated curves, where the bias vanishes) and to show the bias.

Curves need at least :data:`MIN_EVAL_POINTS` points, or the interpolation is too coarse to read.
"""

from __future__ import annotations

import math
import random
import statistics
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
    """An arm's rollouts to the baseline's own target against it over paired seeds
    (:func:`rollouts_to_target_ratio`).

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
    """Rollouts to target of ``arm`` against ``base`` on the seeds both have (paired), the target
    being ``target_from``'s own accuracy (the baseline's by default): biased toward the baseline on
    noisy curves (the module docstring); :func:`ratio_to_target` is the estimator to use.

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


@dataclass(frozen=True)
class TargetRatio:
    """An arm's rollouts to a target fixed independently of both curves, against a baseline,
    over paired seeds (:func:`ratio_to_target`).

    Attributes:
        ratio: exp(mean over seeds of log(baseline rollouts / arm rollouts)) (> 1: the arm needs
            fewer); NaN when no seed has a ratio.
        ci_low, ci_high: the 95% Student-t interval of the mean log ratio, exponentiated (NaN
            with fewer than 2 seeds).
        per_seed: baseline / arm per kept seed, in seed order (a censored seed's is a bound).
        seeds: the kept seeds, ascending.
        targets: the target accuracy of each kept seed.
        censored_arm: kept seeds where the arm never reached the target (crossing taken at its
            last evaluation: that seed's ratio is an upper bound).
        censored_base: kept seeds where the baseline never reached it (a lower bound).
        left_out: seeds without a ratio: neither curve reached the target, or one reached it
            at or before its first evaluation (nothing to compare).
    """

    ratio: float
    ci_low: float
    ci_high: float
    per_seed: tuple[float, ...]
    seeds: tuple[int, ...]
    targets: tuple[float, ...]
    censored_arm: tuple[int, ...] = ()
    censored_base: tuple[int, ...] = ()
    left_out: tuple[int, ...] = ()

    @property
    def censored(self) -> int:
        """Kept seeds with a censored crossing (either curve)."""
        return len(self.censored_arm) + len(self.censored_base)

    @property
    def bound(self) -> str:
        """``exact`` (no censoring), ``upper`` (only the arm censored somewhere: the true ratio is
        at most the figure), ``lower`` (only the baseline: at least), or ``mixed`` (both)."""
        if self.censored_arm and self.censored_base:
            return "mixed"
        return "upper" if self.censored_arm else "lower" if self.censored_base else "exact"

    def to_dict(self) -> dict:
        """The figures as JSON-ready values (``compare.json``'s ``rollouts_to_target`` entries)."""
        return {
            "ratio": self.ratio,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "per_seed": list(self.per_seed),
            "seeds": list(self.seeds),
            "targets": list(self.targets),
            "censored": self.censored,
            "censored_arm": list(self.censored_arm),
            "censored_base": list(self.censored_base),
            "bound": self.bound,
            "left_out": list(self.left_out),
            "interval": "t on per-seed log ratios",
        }


def ratio_to_target(arm: Mapping[int, Curve], base: Mapping[int, Curve], targets: Mapping[int, float]) -> TargetRatio:
    """Rollouts to target of ``arm`` against ``base`` on the seeds both curves and ``targets`` have.

    Args:
        arm, base: each arm's curve by seed (paired: same model, data and held-out problems).
        targets: each seed's target accuracy, fixed independently of ``arm`` and ``base``
            (:func:`fixed_targets`, :func:`leave_one_out_targets`).

    Returns:
        :class:`TargetRatio`: the geometric mean of per-seed ratios with its t-interval; censored
        crossings kept as bounds and listed, seeds without a ratio left out and listed.

    Raises:
        ValueError: no seed is common to ``arm``, ``base`` and ``targets``, or a target is not finite.
    """
    from prioreplay.intervals import ratio_interval

    seeds = sorted(set(arm) & set(base) & set(targets))
    if not seeds:
        raise ValueError(f"no common seed: arm {sorted(arm)}, baseline {sorted(base)}, targets {sorted(targets)}")
    bad = [s for s in seeds if not math.isfinite(targets[s])]
    if bad:
        raise ValueError(f"the target of seed {bad[0]} is {targets[bad[0]]!r}; give a finite held-out accuracy")
    kept: list[int] = []
    ratios: list[float] = []
    cens_a: list[int] = []
    cens_b: list[int] = []
    left: list[int] = []
    for s in seeds:
        ra, arm_reached = first_crossing(arm[s], targets[s])
        rb, base_reached = first_crossing(base[s], targets[s])
        if not (arm_reached or base_reached) or min(ra, rb) <= arm[s].rollouts[0]:
            left.append(s)
            continue
        kept.append(s)
        ratios.append(rb / ra)
        if not arm_reached:
            cens_a.append(s)
        if not base_reached:
            cens_b.append(s)
    if not kept:
        return TargetRatio(math.nan, math.nan, math.nan, (), (), (), left_out=tuple(left))
    r, lo, hi = ratio_interval(ratios)
    if len(kept) < 2:
        lo = hi = math.nan
    return TargetRatio(
        ratio=r,
        ci_low=lo,
        ci_high=hi,
        per_seed=tuple(ratios),
        seeds=tuple(kept),
        targets=tuple(targets[s] for s in kept),
        censored_arm=tuple(cens_a),
        censored_base=tuple(cens_b),
        left_out=tuple(left),
    )


def fixed_targets(accuracy: float, seeds: Sequence[int]) -> dict[int, float]:
    """The same target for every seed: a held-out accuracy written down before the runs.

    Raises:
        ValueError: ``accuracy`` outside [0, 1].
    """
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"target accuracy ({accuracy!r}) must be a held-out accuracy in [0, 1]")
    return {s: accuracy for s in seeds}


def leave_one_out_targets(curves: Mapping[int, Curve], at: Mapping[int, float] | None = None) -> dict[int, float]:
    """Per seed s, the mean accuracy of the *other* seeds' curves (e.g. the baseline's), each read
    at ``at[seed]`` rollouts (:meth:`Curve.at`; its last point where ``at`` lacks the seed): a
    target that seed s's own curves cannot move.

    Raises:
        ValueError: fewer than 2 curves (a seed needs another seed's curve).
    """
    if len(curves) < 2:
        raise ValueError(
            f"leave-one-out targets need the baseline's curves of >= 2 seeds (got {len(curves)}); run more seeds or fix "
            "the target accuracy before the runs"
        )
    at = at or {}
    value = {s: c.at(at[s]) if s in at else c.final for s, c in curves.items()}
    return {s: statistics.fmean(v for o, v in value.items() if o != s) for s in curves}
