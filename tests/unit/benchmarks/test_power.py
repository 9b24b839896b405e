"""benchmarks/power.py: seeds needed to detect a held-out difference, from paired curves."""

from __future__ import annotations

import json
import statistics

import pytest

from benchmarks.power import main, paired_spread, result_items, seeds_needed


def _run(arm: str, seed: int, accs: list[float]) -> dict:
    curve = [{"rollouts": 100 * i, "policy_version": i or 0, "accuracy": a} for i, a in enumerate(accs)]
    curve[-1]["policy_version"] = None  # the end point, as the demo writes it
    return {"sampler": arm, "seed": seed, "heldout_curve": curve}


RUNS = [
    _run("grpo", 0, [0.5, 0.6, 0.7]),
    _run("grpo", 1, [0.5, 0.6, 0.7]),
    _run("grpo", 2, [0.5, 0.6, 0.7]),
    _run("heap", 0, [0.5, 0.7, 0.70]),
    _run("heap", 1, [0.5, 0.6, 0.80]),
    _run("heap", 2, [0.5, 0.5, 0.75]),
    _run("heap", 3, [0.5, 0.5, 0.75]),  # no grpo run of seed 3: not paired
]


def test_seeds_needed_is_the_paired_normal_formula_and_refuses_nonsense():
    assert seeds_needed(0.1, 0.05) == pytest.approx((2.8015852 * 2) ** 2, rel=1e-6)
    assert seeds_needed(0.0, 0.05) == 0.0 and seeds_needed(0.2, 0.05) == pytest.approx(4 * seeds_needed(0.1, 0.05))
    with pytest.raises(ValueError, match="delta"):
        seeds_needed(0.1, 0.0)
    with pytest.raises(ValueError, match="sigma"):
        seeds_needed(float("nan"), 0.05)


def test_the_spread_is_taken_per_evaluation_over_paired_seeds_only():
    rows = paired_spread(RUNS, "heap", "grpo")
    assert [r["index"] for r in rows] == [0, 1, 2] and rows[0]["seeds"] == [0, 1, 2]
    assert rows[0]["sigma"] == 0.0  # before training both arms are the same model
    assert rows[1]["diffs"] == pytest.approx([0.1, 0.0, -0.1]) and rows[1]["sigma"] == pytest.approx(0.1)
    assert rows[2]["sigma"] == pytest.approx(statistics.stdev([0.0, 0.1, 0.05]))
    assert rows[1]["policy_version"] == 1 and rows[2]["policy_version"] is None
    assert paired_spread(RUNS, "dapo", "grpo") == []
    with pytest.raises(ValueError, match="--eval-points"):
        paired_spread([*RUNS, _run("grpo", 3, [0.5, 0.6])], "heap", "grpo")


def test_figures_are_named_per_arm_and_evaluation(tmp_path):
    items = {i["name"]: i for i in result_items({"samplers": ["grpo", "heap"], "runs": RUNS}, "grpo", 0.05, "cmd", "")}
    assert set(items) == {
        "method.power.heap_vs_grpo.sigma_at_1",
        "method.power.heap_vs_grpo.sigma_at_2",
        "method.power.heap_vs_grpo.seeds_for_5pts",
    }
    need = items["method.power.heap_vs_grpo.seeds_for_5pts"]
    assert need["value"] == pytest.approx(seeds_needed(statistics.stdev([0.0, 0.1, 0.05]), 0.05)) and need["n"] == 3
    (tmp_path / "compare.json").write_text(json.dumps({"samplers": ["grpo", "heap"], "runs": RUNS}))
    out = tmp_path / "results.json"
    assert main([str(tmp_path), "--out", str(out)]) == 0
    assert "method.power.heap_vs_grpo.seeds_for_5pts" in {i["name"] for i in json.loads(out.read_text())}
    with pytest.raises(SystemExit, match="not an arm"):
        main([str(tmp_path), "--base", "dapo"])
