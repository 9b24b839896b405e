"""benchmarks/method.py: the three baselines and rollouts to target on a tiny simulated population."""

from __future__ import annotations

import math

import pytest

from benchmarks.method import QUICK_PARAMS, arms_named, eval_curve, result_items, run


def test_eval_curve_reads_the_per_batch_curve_at_even_points():
    c = eval_curve([0, 10, 20, 30, 40], [0.0, 0.1, 0.2, 0.3, 0.4], 5, 40.0)
    assert c.rollouts == (0.0, 10.0, 20.0, 30.0, 40.0) and c.accuracy[2] == 0.2


def test_every_arm_gets_both_ratios_and_a_figure_per_name():
    out = run(QUICK_PARAMS, [0, 1], arms_named([]), points=5)
    assert list(out["arms"]) == ["grpo", "dapo", "heap"]
    assert "vs_grpo" not in out["arms"]["grpo"] and "vs_dapo" not in out["arms"]["dapo"]
    heap = out["arms"]["heap"]
    assert heap["vs_grpo"].seeds == (0, 1) and heap["vs_grpo"].ratio > 0
    assert heap["vs_grpo"].targets == heap["vs_dapo"].targets  # both at grpo's accuracy at its budget
    names = {i["name"] for i in result_items(out, "cmd", "note")}
    assert {"method.rollouts_to_target.heap_vs_grpo", "method.rollouts_to_target.heap_vs_dapo"} <= names
    assert {"method.rollouts_to_target.dapo_vs_grpo", "method.final_at_2x.grpo", "method.misfiled.heap"} <= names
    item = next(i for i in result_items(out, "cmd", "note") if i["name"] == "method.rollouts_to_target.heap_vs_grpo")
    assert item["ci_low"] <= item["value"] <= item["ci_high"] and not math.isnan(item["ci_low"])


def test_real_compare_figures_pool_the_audit_over_seeds():
    from benchmarks.method import compare_items

    def run(arm, seed, pooled, bad):
        audit = {"pooled": pooled, "misfiled": bad, "misfiled_share": bad / pooled, "lost_opportunity_share": 0.01}
        return {"sampler": arm, "seed": seed, "pool_audit": audit}

    cmp = {
        "samplers": ["heap", "heap-evidence", "dapo"],
        "runs": [run("heap", 0, 40, 12), run("heap", 1, 60, 18), run("heap-evidence", 0, 30, 3), {"sampler": "dapo", "seed": 0}],
        "rollouts_to_target": {
            "heap_vs_grpo": {"ratio": 1.2, "ci_low": 0.9, "ci_high": 1.5, "per_seed": [1.2], "seeds": [0], "censored": 0}
        },
    }
    items = {i["name"]: i for i in compare_items(cmp, "cmd", "")}
    assert set(items) == {
        "method.misfiled.demo_heap",
        "method.misfiled.demo_heap_evidence",
        "method.rollouts_to_target.demo_heap_vs_grpo",
    }
    heap = items["method.misfiled.demo_heap"]
    assert heap["value"] == 0.3 and heap["pooled"] == 100 and heap["ci_low"] < 0.3 < heap["ci_high"]


def test_real_compare_records_each_arms_accuracy_at_2r_and_its_gap_to_grpo():
    from benchmarks.method import compare_items

    after = {"grpo": [0.5, 0.6, 0.7], "heap": [0.4, 0.5, 0.6]}
    cmp = {
        "samplers": ["grpo", "heap", "dapo"],
        "runs": [],
        "target_fraction": 0.5,
        "arms": {a: {"accuracy_after": {"mean": sum(v) / 3, "ci95": [min(v), max(v)], "values": v}} for a, v in after.items()},
        "final_vs_grpo": {"heap": {"mean": -0.1, "ci95": [-0.12, -0.08], "per_seed": [-0.1] * 3}},
        "rollouts_to_target": {
            "heap_vs_grpo": {"ratio": 1.6, "ci_low": 1.1, "ci_high": 2.0, "per_seed": [1.6], "seeds": [0], "censored": 0}
        },
    }
    items = {i["name"]: i for i in compare_items(cmp, "cmd", "")}
    assert set(items) == {
        "method.final_at_2x.demo_grpo",
        "method.final_at_2x.demo_heap",
        "method.rollouts_to_target.demo_heap_vs_grpo",
    }  # dapo has no accuracy: no figure
    heap = items["method.final_at_2x.demo_heap"]
    assert heap["value"] == pytest.approx(0.5) and heap["minus_grpo"] == -0.1 and heap["met"] is False  # a plateau
    assert items["method.final_at_2x.demo_grpo"]["met"] is None
    assert items["method.rollouts_to_target.demo_heap_vs_grpo"]["met"] is True
    assert "0.5 of the rollout budget" in items["method.rollouts_to_target.demo_heap_vs_grpo"]["how"]


def test_warm_start_run_measures_the_first_epoch_warm_and_cold(tmp_path):
    from benchmarks.method import warm_start_run

    out = warm_start_run(QUICK_PARAMS, [0, 1], 0.5, tmp_path)
    assert out["ratio"]["n"] == 2 and 0 < out["cold"]["mean"] < 1 and 0 < out["warm"]["mean"] <= 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["warm-0.json", "warm-1.json"]


def test_warm_start_rollouts_to_target_is_cold_over_warm_at_the_cold_runs_final_accuracy(tmp_path):
    from benchmarks.method import warm_start_items, warm_start_run

    out = warm_start_run(QUICK_PARAMS, [0, 1, 2], 0.5, tmp_path, points=5)
    t = out["rollouts_to_target"]
    assert t.seeds == (0, 1, 2) and out["points_per_run"] == 5 and out["budget"] == QUICK_PARAMS.budget_rollouts
    warm, cold = out["warm_rollouts"], out["cold_rollouts"]
    # each cold run reaches its own final accuracy within the budget; the warm run's crossing is read on its curve
    assert all(0 < c <= QUICK_PARAMS.budget_rollouts for c in cold) and all(0 <= w <= QUICK_PARAMS.budget_rollouts for w in warm)
    assert math.isclose(t.ratio, sum(cold) / sum(warm)) and t.ci_low <= t.ratio <= t.ci_high
    assert all(math.isclose(v, c / w) for v, c, w in zip(t.per_seed, cold, warm, strict=True))
    # the target of a seed: the cold run's held-out accuracy at R
    assert len(t.targets) == 3 and math.isclose(sum(t.targets) / 3, out["final_cold"]["mean"])
    items = {i["name"]: i for i in warm_start_items(out, "cmd", "note")}
    assert set(items) == {"method.warm_start.first_epoch_useful_ratio", "method.warm_start.rollouts_to_target_ratio"}
    item = items["method.warm_start.rollouts_to_target_ratio"]
    assert item["value"] == t.ratio and item["unit"] == "ratio" and item["values"] == list(t.per_seed)
    assert item["censored"] == t.censored and item["met"] == (t.ratio >= 1.0) and item["seeds"] == [0, 1, 2]
    assert item["final_cold"] == out["final_cold"]["mean"] and item["final_warm"] == out["final_warm"]["mean"]
    assert math.isclose(item["final_diff_warm_minus_cold"], item["final_warm"] - item["final_cold"], abs_tol=1e-12)


def test_arms_against_heap_get_the_paired_misfiled_change_and_the_ratio_of_ratios():
    out = run(QUICK_PARAMS, [0, 1, 2], arms_named(["heap_retest03"]), points=5)
    assert "vs_heap" not in out["arms"]["heap"] and "vs_heap" not in out["arms"]["dapo"]
    arm, heap = out["arms"]["heap_retest03"], out["arms"]["heap"]
    # heap's rollouts over the arm's = the arm's ratio against grpo over heap's (grpo's rollouts cancel)
    assert arm["vs_heap"].ratio == pytest.approx(arm["vs_grpo"].ratio / heap["vs_grpo"].ratio)
    assert arm["vs_heap"].ci_low <= arm["vs_heap"].ratio <= arm["vs_heap"].ci_high
    change = arm["misfiled_change_vs_heap"]
    assert change["n"] == 3 and change["mean"] == pytest.approx(arm["misfiled"]["mean"] - heap["misfiled"]["mean"])
    items = {i["name"]: i for i in result_items(out, "cmd", "note")}
    assert "target" not in items["method.rollouts_to_target.heap_retest03_vs_heap"]
    assert items["method.misfiled_change.heap_retest03_vs_heap"]["value"] == change["mean"]
    assert "method.misfiled_change.heap_vs_heap" not in items


def test_paired_change_leaves_out_seeds_with_an_empty_pool():
    from benchmarks.method import _paired_change

    assert _paired_change([0.3, math.nan, 0.2, 0.1], [0.1, 0.2, math.nan, 0.4]) == pytest.approx([0.2, -0.3])
