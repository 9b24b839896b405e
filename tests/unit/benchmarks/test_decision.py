"""Section 8's decision rule (benchmarks/decision.py) on made-up runs whose verdict is known."""

from __future__ import annotations

import json

import pytest

from benchmarks import decision
from prioreplay.apps.compare import _SUMMED
from prioreplay.errors import InvalidArgument


def run(arm: str, seed: int, useful: float, acc: float, misfiled: float | None = 0.3) -> dict:
    """One run's figures as compare.run_metrics gives them (the keys the rule reads)."""
    r = {k: None for k in _SUMMED}
    r.update(
        sampler=arm,
        seed=seed,
        effective_group_fraction=useful,
        useful_token_fraction=useful,
        accuracy_after=acc,
        pool_misfiled_share=misfiled,
        accuracy_after_each=None,
    )
    return r


def mixset(arm_useful: float, arm_acc: float, seeds: int = 5, arm: str = "posterior") -> dict:
    runs = []
    for s in range(seeds):
        jitter = 0.01 * (s % 3 - 1)
        runs += [run("uniform", s, 0.40 + jitter, 0.50 + jitter), run("heap", s, 0.45 + jitter, 0.50 + jitter)]
        runs.append(run(arm, s, arm_useful + jitter, arm_acc + jitter * 0.5))
    return decision.summarize_set(runs)


def test_an_arm_better_on_both_counts_on_the_mix_and_not_worse_on_easy_becomes_the_default():
    v = decision.decide(mixset(0.70, 0.60), mixset(0.50, 0.50, seeds=3))
    assert v["samplers"]["posterior"]["passes"] is True
    assert v["default_sampler"] == "posterior"
    assert v["targets"]["posterior"]["useful_tokens_ratio_ge_1_5"] is True  # 0.70 / 0.40
    assert v["targets"]["heap"]["useful_tokens_ratio_ge_1_5"] is False


def test_heldout_accuracy_no_better_than_uniform_keeps_heap_whatever_the_useful_tokens():
    v = decision.decide(mixset(0.90, 0.50), mixset(0.50, 0.50, seeds=3))
    assert v["samplers"]["posterior"]["conditions"]["mix_useful_ratio_above_1"] is True
    assert v["samplers"]["posterior"]["conditions"]["mix_heldout_above_zero"] is False
    assert v["default_sampler"] == "heap"


def test_an_arm_worse_on_the_easy_set_does_not_win():
    v = decision.decide(mixset(0.70, 0.60), mixset(0.50, 0.40, seeds=3))
    assert v["samplers"]["posterior"]["conditions"]["easy_heldout_not_below_zero"] is False
    assert v["default_sampler"] == "heap"


def test_one_seed_or_no_easy_set_leaves_the_rule_undecided_and_the_default_unchanged():
    one = decision.decide(mixset(0.70, 0.60, seeds=1), None)
    assert one["samplers"]["posterior"]["passes"] is None
    assert one["default_sampler"] == "heap"
    no_easy = decision.decide(mixset(0.70, 0.60), None)
    assert no_easy["samplers"]["posterior"]["conditions"]["easy_heldout_not_below_zero"] is None
    assert no_easy["default_sampler"] == "heap"


def test_a_retest_setting_wins_only_by_lowering_the_misfiled_share_against_its_own_sampler():
    runs = []
    for s in range(5):
        d = 0.01 * (s % 3 - 1)
        runs += [run("uniform", s, 0.4, 0.5 + d), run("heap", s, 0.45, 0.5 + d, misfiled=0.40 + d)]
        runs.append(run("heap-version-retests", s, 0.45, 0.5 + d, misfiled=0.20 + d))
    v = decision.decide(decision.summarize_set(runs), None)
    assert v["settings"]["heap-version-retests"]["passes"] is True
    assert v["default_retest_setting"] == "heap-version-retests"
    assert v["targets"]["heap-version-retests"]["misfiled_le_10pct"] is False  # 0.20 > 0.10
    worse = [dict(r, accuracy_after=r["accuracy_after"] - 0.1) if r["sampler"] == "heap-version-retests" else r for r in runs]
    assert decision.decide(decision.summarize_set(worse), None)["default_retest_setting"] is None


def test_compares_runs_named_dapo_and_grpo_judge_only_the_setting_against_its_sampler():
    # prioreplay compare names the filtered baseline dapo and runs grpo beside it: neither is a candidate
    runs = []
    for s in range(4):
        d = 0.01 * (s % 3 - 1)
        runs += [run("dapo", s, 0.4, 0.5 + d), run("grpo", s, 0.3, 0.5 + d), run("heap", s, 0.45, 0.5 + d, misfiled=0.3 + d)]
        runs.append(run("heap-evidence", s, 0.45, 0.5 + d, misfiled=0.1 + d))
    v = decision.decide(decision.summarize_set(runs), None)
    assert v["samplers"] == {} and set(v["settings"]) == {"heap-evidence"} and "grpo" not in v["targets"]
    assert v["settings"]["heap-evidence"]["against"] == "heap" and v["default_retest_setting"] == "heap-evidence"
    mixed = decision.summarize_set([run("uniform", 0, 0.4, 0.5), run("dapo", 1, 0.4, 0.5), run("heap", 0, 0.5, 0.5)])
    assert mixed["arms"]["dapo"]["seeds"] == [0, 1]  # a run from before the rename counts as dapo


def test_runs_without_the_baseline_are_refused_by_name():
    with pytest.raises(InvalidArgument, match="'dapo'"):
        decision.summarize_set([run("heap", 0, 0.5, 0.5), run("posterior", 0, 0.5, 0.5)])


def test_results_carry_the_names_the_issue_asks_for(tmp_path):
    mix = mixset(0.70, 0.60)
    items = decision.result_items("mix", mix, "cmd", "quiet")
    names = {i["name"] for i in items}
    for fig in ("useful_tokens_ratio_vs_uniform", "heldout_change_vs_uniform", "pool_misfiled_share"):
        assert f"compare.mix.posterior.{fig}" in names
    held = next(i for i in items if i["name"] == "compare.mix.posterior.heldout_change_vs_uniform")
    assert held["value"] == pytest.approx(0.101) and held["met"] is True
    out = tmp_path / "results.json"
    out.write_text(json.dumps([{"name": "other", "value": 1}]))
    from benchmarks.results import merge_results

    merge_results(out, items)
    assert json.loads(out.read_text())[0]["name"] == "other"
