"""The rollouts-to-target estimator on simulated identical arms (benchmarks/estimator.py): honest
estimators centre on 1 and their intervals cover it; the old own-target one does not."""

from __future__ import annotations

import pytest

from benchmarks.estimator import DEMO_DESIGN, NullDesign, null_curves, null_experiment, result_items


def test_identical_arms_give_a_median_ratio_near_1_and_intervals_that_cover_it():
    # 200 experiments of 6 paired seeds, 256-problem evaluations at 9 points to 2R (the decision runs' design)
    out = null_experiment(NullDesign(seeds=6, eval_size=256), ("leave_one_out", "fixed"), repetitions=200, seed=0)
    for est in ("leave_one_out", "fixed"):
        assert 0.95 <= out[est]["median"] <= 1.05, (est, out[est])
        assert out[est]["coverage"] >= 0.90, (est, out[est])


def test_the_old_own_target_estimator_favours_the_baseline():
    out = null_experiment(DEMO_DESIGN, ("old", "leave_one_out"), repetitions=100, seed=0)
    assert out["old"]["median"] < 0.9 < out["leave_one_out"]["median"]
    assert out["old"]["below"] > 0.1  # an interval wholly below 1 for identical arms, often


def test_null_curves_share_the_score_before_training_and_differ_after():
    import numpy as np

    arm, grpo = null_curves(NullDesign(seeds=3), np.random.default_rng(0))
    assert sorted(arm) == sorted(grpo) == [0, 1, 2]
    assert all(arm[s].accuracy[0] == grpo[s].accuracy[0] for s in arm)
    assert any(arm[s].accuracy[1:] != grpo[s].accuracy[1:] for s in arm)
    assert arm[0].rollouts[4] == 1.0  # R is the middle evaluation of 9


def test_result_items_name_the_default_estimator_bare_and_the_others_by_name():
    fig = {"median": 1.0, "coverage": 0.95, "below": 0.02, "above": 0.03, "no_ratio": 0, "repetitions": 10}
    figs = {e: fig for e in ("leave_one_out", "old")}
    items = {i["name"]: i for i in result_items({"": (NullDesign(), figs), "demo.": (DEMO_DESIGN, figs)}, "cmd", "")}
    assert {"method.estimator.null_median", "method.estimator.null_coverage", "method.estimator.old.null_median"} <= set(items)
    assert "method.estimator.demo.old.null_coverage" in items
    assert items["method.estimator.null_coverage"]["met"] is True
    assert items["method.estimator.null_median"]["estimator"] == "leave_one_out"


def test_a_design_needs_an_odd_number_of_points():
    with pytest.raises(ValueError, match="odd"):
        NullDesign(points=8)
