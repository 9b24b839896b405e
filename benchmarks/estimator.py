"""Is rollouts to target honest? The estimator run on simulated *identical* arms (the null).

Two arms that are the same method ("arm" and "grpo") train on every seed; their held-out learning
curves are drawn from one model, so the true ratio of their rollouts to any target is 1. An honest
estimator gives a median ratio near 1 over many such experiments, and its 95% interval covers 1
in about 95% of them. Each experiment (:func:`null_experiment`) has ``seeds`` paired seeds; per run
the held-out accuracy at ``x`` rollouts (R = 1, every run to 2R) is

    a(x) = start + (gain + u_s + e_{s,arm}) · (1 − exp(−x / tau)) / (1 − exp(−2 / tau)),

with u_s ~ N(0, seed_sd²) shared by the arms of seed s (its held-out problems and data), e ~
N(0, run_sd²) each run's own (its sampling draws), read at ``points`` evenly spaced evaluations in
[0, 2R] (R the middle one) with the binomial noise of ``eval_size`` held-out problems (the point
at 0 rollouts is the same model for both arms of a seed, so it is drawn once per seed).

Estimators compared (:mod:`prioreplay.curves`):

* ``leave_one_out`` (the default of ``prioreplay compare``): seed s's target is the mean over
  grpo's *other* seeds of their accuracy at R; geometric mean of per-seed ratios, t-interval of
  the mean log ratio;
* ``fixed``: a held-out accuracy fixed before the runs (here the model's mean accuracy at R),
  the same ratio and interval;
* ``old``: grpo's own accuracy at R as the target, Σ grpo / Σ arm with a paired percentile
  bootstrap (what compare did before; its bias is the reason for the others).

``python -m benchmarks.estimator --out benchmarks/results.json`` records
``method.estimator.null_median`` and ``method.estimator.null_coverage`` (the default estimator)
and the others' figures beside them (``method.estimator.<estimator>.*``), for the design of the
decision runs (6 seeds, 256 held-out problems) and for that of the first real comparison (3
seeds, 64 problems: ``method.estimator.demo.*``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prioreplay.curves import Curve, fixed_targets, leave_one_out_targets, ratio_to_target, rollouts_to_target_ratio

#: The estimators :func:`null_experiment` can apply.
ESTIMATORS = ("leave_one_out", "fixed", "old")


@dataclass(frozen=True)
class NullDesign:
    """One null experiment's design: identical arms, paired seeds, noisy held-out evaluations.

    Attributes:
        seeds: paired seeds per experiment.
        eval_size: held-out problems scored at each evaluation (binomial noise of a proportion).
        points: evaluations in [0, 2R], evenly spaced, odd so that R is one of them (>= 5).
        start: held-out accuracy before training.
        gain: mean accuracy gained by 2R.
        tau: the curve's time constant, in units of R (smaller: an earlier plateau).
        seed_sd: spread of the gain between seeds, shared by the arms of a seed (accuracy).
        run_sd: spread of the gain between the runs of one seed (accuracy).
    """

    seeds: int = 6
    eval_size: int = 256
    points: int = 9
    start: float = 0.33
    gain: float = 0.20
    tau: float = 1.0
    seed_sd: float = 0.03
    run_sd: float = 0.03

    def __post_init__(self) -> None:
        if self.points < 5 or self.points % 2 == 0:
            raise ValueError(f"points ({self.points}) must be odd and >= 5 (R is the middle evaluation)")
        if self.seeds < 2 or self.eval_size < 1:
            raise ValueError(f"seeds ({self.seeds}) must be >= 2 and eval_size ({self.eval_size}) >= 1")

    def progress(self, x: Any) -> Any:
        """Share of the gain reached at ``x`` rollouts (units of R; a float or an array): 0 at 0, 1 at 2R."""
        return (1 - np.exp(-np.asarray(x, dtype=float) / self.tau)) / (1 - math.exp(-2 / self.tau))

    def mean_at(self, x: float) -> float:
        """The model's mean held-out accuracy at ``x`` rollouts (units of R)."""
        return self.start + self.gain * float(self.progress(x))


#: The first real comparison's design (docs/METHOD.md: 3 seeds, 64 held-out problems, 7 points).
DEMO_DESIGN = NullDesign(seeds=3, eval_size=64, points=7)


def null_curves(design: NullDesign, rng: np.random.Generator) -> tuple[dict[int, Curve], dict[int, Curve]]:
    """One experiment's curves of two identical arms: ({seed: arm curve}, {seed: grpo curve})."""
    xs = np.linspace(0.0, 2.0, design.points)  # (P,)
    shape = design.progress(xs)  # (P,)
    n = design.eval_size
    arm: dict[int, Curve] = {}
    grpo: dict[int, Curve] = {}
    for s in range(design.seeds):
        u = rng.normal(0.0, design.seed_sd)
        before = rng.binomial(n, design.start) / n  # one model before training: one score for both arms
        for out in (arm, grpo):
            p = np.clip(design.start + (design.gain + u + rng.normal(0.0, design.run_sd)) * shape, 0.0, 1.0)  # (P,)
            acc = rng.binomial(n, p) / n  # (P,)
            acc[0] = before
            out[s] = Curve(tuple(float(x) for x in xs), tuple(float(a) for a in acc))
    return arm, grpo


def estimate(name: str, arm: dict[int, Curve], grpo: dict[int, Curve], design: NullDesign) -> tuple[float, float, float]:
    """(ratio, low, high) of estimator ``name`` (:data:`ESTIMATORS`) for one experiment."""
    if name == "old":
        r = rollouts_to_target_ratio(arm, grpo, target_at={s: 1.0 for s in grpo}, resamples=2000)
        return r.ratio, r.ci_low, r.ci_high
    if name == "leave_one_out":
        targets = leave_one_out_targets(grpo, {s: 1.0 for s in grpo})
    elif name == "fixed":
        targets = fixed_targets(design.mean_at(1.0), sorted(grpo))
    else:
        raise ValueError(f"unknown estimator {name!r}; choose from {', '.join(ESTIMATORS)}")
    t = ratio_to_target(arm, grpo, targets)
    return t.ratio, t.ci_low, t.ci_high


def null_experiment(design: NullDesign, estimators: tuple[str, ...], repetitions: int = 200, seed: int = 0) -> dict[str, Any]:
    """Run ``repetitions`` null experiments; per estimator the median ratio, the share of intervals
    that cover 1, and the share wholly below / above 1 (an experiment without a ratio counts as not
    covering, and is counted in ``no_ratio``).

    Returns:
        {estimator: {"median", "coverage", "below", "above", "no_ratio", "repetitions"}}.
    """
    rng = np.random.default_rng([seed, design.seeds, design.eval_size])
    found: dict[str, list[tuple[float, float, float]]] = {e: [] for e in estimators}
    for _ in range(repetitions):
        arm, grpo = null_curves(design, rng)
        for e in estimators:
            found[e].append(estimate(e, arm, grpo, design))
    out = {}
    for e, rows in found.items():
        ok = [(r, lo, hi) for r, lo, hi in rows if math.isfinite(r) and math.isfinite(lo) and math.isfinite(hi)]
        out[e] = {
            "median": statistics.median(r for r, _, _ in ok) if ok else math.nan,
            "coverage": sum(lo <= 1.0 <= hi for _, lo, hi in ok) / repetitions,
            "below": sum(hi < 1.0 for _, _, hi in ok) / repetitions,
            "above": sum(lo > 1.0 for _, lo, _ in ok) / repetitions,
            "no_ratio": repetitions - len(ok),
            "repetitions": repetitions,
        }
    return out


def result_items(runs: dict[str, tuple[NullDesign, dict[str, Any]]], command: str, note: str) -> list[dict[str, Any]]:
    """results.json entries ``method.estimator.*``: per design (``""`` the decision runs' design,
    ``demo.`` the first real comparison's) and estimator the null median and coverage; the default
    estimator's figures under the bare names ``null_median`` and ``null_coverage``."""
    from benchmarks.results import Results

    res = Results(command, note=note, prefix="method.estimator.")
    for prefix, (design, figs) in runs.items():
        for est, f in figs.items():
            name = f"{prefix}{'' if est == 'leave_one_out' else est + '.'}"
            common = {
                "estimator": est,
                "design": asdict(design),
                "repetitions": f["repetitions"],
                "below_1": f["below"],
                "above_1": f["above"],
                "no_ratio": f["no_ratio"],
            }
            how = (
                f"{f['repetitions']} simulated experiments of two identical arms ({design.seeds} seeds, "
                f"{design.eval_size}-problem held-out evaluations at {design.points} points to 2R): "
            )
            res.add(
                f"{name}null_median",
                f["median"],
                "ratio",
                **common,
                how=how + "the median of the experiment's rollouts-to-target ratio (1: unbiased)",
                target="within [0.95, 1.05]",
                met=bool(0.95 <= f["median"] <= 1.05),
            )
            res.add(
                f"{name}null_coverage",
                f["coverage"],
                "fraction",
                **common,
                how=how + "the share whose 95% interval covers 1",
                target=">= 0.9",
                met=bool(f["coverage"] >= 0.9),
            )
    return res.items


def main(argv: list[str] | None = None) -> int:
    """Print the null figures of every estimator; with ``--out`` merge them into it."""
    from benchmarks.results import merge_results

    ap = argparse.ArgumentParser(prog="python -m benchmarks.estimator", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repetitions", type=int, default=200, help="null experiments per design (default 200)")
    ap.add_argument("--out", help="results.json to merge the figures into")
    ap.add_argument("--note", default="", help="anything a reader of results.json should know")
    a = ap.parse_args(argv)
    runs = {
        "": (NullDesign(), null_experiment(NullDesign(), ESTIMATORS, a.repetitions)),
        "demo.": (DEMO_DESIGN, null_experiment(DEMO_DESIGN, ESTIMATORS, a.repetitions)),
    }
    for design, figs in runs.values():
        for est, f in figs.items():
            print(
                f"{design.seeds} seeds, {design.eval_size} held-out problems, {est:<13}: median {f['median']:.3f}, "
                f"covers 1 {f['coverage']:.1%}, wholly below {f['below']:.1%}, above {f['above']:.1%} "
                f"(no ratio {f['no_ratio']} of {f['repetitions']})"
            )
    if a.out:
        command = "python -m benchmarks.estimator " + " ".join(sys.argv[1:] if argv is None else argv)
        merge_results(Path(a.out), result_items(runs, command, a.note))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
