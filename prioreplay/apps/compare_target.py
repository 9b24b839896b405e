"""Rollouts to target in ``prioreplay compare``: the target, fixed independently of the arms compared,
and each arm's ratio against ``grpo`` and ``dapo`` (:mod:`prioreplay.curves`; docs/METHOD.md,
"How the figures are measured")."""

from __future__ import annotations

from typing import Any


def rollouts_to_target(
    by_arm: dict[str, dict[int, dict]],
    samplers: list[str],
    target_fraction: float = 0.5,
    target_accuracy: float | None = None,
) -> dict[str, Any]:
    """Each arm's rollouts to a held-out target against ``grpo`` and ``dapo``
    (:func:`prioreplay.curves.ratio_to_target`: first crossings interpolated on the runs'
    ``heldout_curve``; per-seed ratios, geometric mean with a t-interval of the mean log ratio;
    censored crossings kept as bounds and listed; > 1: fewer rollouts).

    The target is fixed independently of the two arms compared (:func:`target_of`):
    ``target_accuracy`` when given (written down before the runs), else per seed the mean of
    ``grpo``'s accuracy at ``target_fraction`` of its budget over its *other* seeds. Empty
    without curves of >= 5 points (``--eval-points 3`` or more), and without a ``grpo`` arm of
    >= 2 seeds unless ``target_accuracy`` is given.

    Raises:
        ValueError: ``target_fraction`` outside (0, 1], or ``target_accuracy`` outside [0, 1].
    """
    from prioreplay.curves import ratio_to_target

    curves = {arm: heldout_curves(by_arm.get(arm, {})) for arm in samplers}
    targets = target_of(by_arm, curves.get("grpo", {}), target_fraction, target_accuracy)["per_seed"]
    out: dict[str, Any] = {}
    if not targets:
        return out
    for arm in samplers:
        for base in ("grpo", "dapo"):
            mine, theirs = curves[arm], curves.get(base, {})
            if arm == base or not theirs or not (set(mine) & set(theirs) & set(targets)):
                continue
            out[f"{arm}_vs_{base}"] = ratio_to_target(mine, theirs, targets).to_dict()
    return out


def heldout_curves(runs: dict[int, dict]) -> dict[int, Any]:
    """Each seed's held-out curve (:class:`prioreplay.curves.Curve`) from its run's ``heldout_curve``;
    runs with fewer than 5 scored points are left out."""
    from prioreplay.curves import MIN_EVAL_POINTS, curves_from_points

    out = {}
    for seed, run in runs.items():
        pts = [(p["rollouts"], p["accuracy"]) for p in run.get("heldout_curve") or [] if p.get("accuracy") is not None]
        if len(pts) >= MIN_EVAL_POINTS:
            out[seed] = curves_from_points(pts)
    return out


def target_of(
    by_arm: dict[str, dict[int, dict]], grpo: dict[int, Any], target_fraction: float, target_accuracy: float | None
) -> dict[str, Any]:
    """The target of rollouts to target, per seed, and how it was fixed.

    ``kind`` ``fixed``: ``target_accuracy`` for every seed that has a curve in some arm;
    ``leave_one_out``: seed s's target is the mean over grpo's other seeds of their accuracy at
    ``target_fraction`` of their rollout budget (of their last evaluation without one): a baseline
    seed that is not in seed s's comparison. ``per_seed`` is empty (``kind`` ``none``) when grpo
    has fewer than 2 seeds with curves and no accuracy is given.

    Raises:
        ValueError: ``target_fraction`` outside (0, 1], or ``target_accuracy`` outside [0, 1].
    """
    from prioreplay.curves import fixed_targets, leave_one_out_targets

    if not 0.0 < target_fraction <= 1.0:
        raise ValueError(f"target_fraction must be in (0, 1] (got {target_fraction!r}); 0.5 reads grpo's accuracy at R of 2R")
    if target_accuracy is not None:
        seeds = sorted({s for runs in by_arm.values() for s in runs})
        return {"kind": "fixed", "accuracy": target_accuracy, "per_seed": fixed_targets(target_accuracy, seeds)}
    if len(grpo) < 2:
        return {"kind": "none", "per_seed": {}, "why": "no --target-accuracy and grpo curves of fewer than 2 seeds"}
    runs = by_arm["grpo"]
    at = {s: target_fraction * (runs[s].get("rollout_budget") or c.rollouts[-1]) for s, c in grpo.items()}
    return {"kind": "leave_one_out", "fraction": target_fraction, "at_rollouts": at, "per_seed": leave_one_out_targets(grpo, at)}


def target_summary(by_arm: dict[str, dict[int, dict]], target_fraction: float, target_accuracy: float | None) -> dict:
    """``compare.json``'s ``target``: :func:`target_of` without the rollouts it was read at."""
    t = target_of(by_arm, heldout_curves(by_arm.get("grpo", {})), target_fraction, target_accuracy)
    return {k: v for k, v in t.items() if k != "at_rollouts"}


def target_lines(summary: dict[str, Any]) -> list[str]:
    """One line per rollouts-to-target ratio, with the target and any censoring spelled out."""
    t = summary.get("target") or {}
    if t.get("kind") == "fixed":
        what = f"the held-out accuracy {t['accuracy']:.3f} fixed before the runs"
    else:
        what = f"grpo's mean accuracy at {summary.get('target_fraction', 0.5):g} of the budget over its other seeds"
    lines = []
    for name, r in summary.get("rollouts_to_target", {}).items():
        if not r["seeds"]:
            lines.append(f"rollouts to {what}, {name.replace('_vs_', ' vs ')}: no seed has a ratio (left out {r['left_out']})")
            continue
        bound = {"upper": "; an upper bound", "lower": "; a lower bound", "mixed": "; bounded both ways"}.get(r["bound"], "")
        lines.append(
            f"rollouts to {what}, {name.replace('_vs_', ' vs ')}: {r['ratio']:.2f}x [{r['ci_low']:.2f}, {r['ci_high']:.2f}] "
            f"over seeds {r['seeds']} (> 1: fewer rollouts; t-interval of the log ratio; never reached: arm "
            f"{r['censored_arm'] or 'none'}, baseline {r['censored_base'] or 'none'}{bound}; no ratio: {r['left_out'] or 'none'})"
        )
    return lines
