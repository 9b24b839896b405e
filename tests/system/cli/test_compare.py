"""``prioreplay compare``: arms that differ beyond the sampler are refused; the report's fields.

The end-to-end test runs the real command on a tiny random Llama (built in the test): two
samplers, one seed, a rollout budget of 48 completions, 4 held-out problems, 8 new tokens.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from prioreplay.apps.cli import parse
from prioreplay.apps.compare import check_arms, final_vs_grpo, rollouts_to_target, run_metrics, summarize, summary_lines
from prioreplay.apps.compare_config import default_samplers
from prioreplay.errors import InvalidArgument
from prioreplay.tiny_model import make_tiny_model
from tests.conftest import cli


def _report(sampler: str, seed: int, mixed: int, groups: int, **cfg) -> dict:
    config = {
        "model": "m",
        "dataset": "arithmetic:64:0:easy:line",
        "group_size": 4,
        "rollouts": 400,
        "sampler": sampler,
        "seed": seed,
        "run_dir": f"runs/{sampler}-{seed}",
        "lr": 1e-5,
        **cfg,
    }
    steps = [
        {
            "step": 1,
            "completions": groups * 2,
            "groups": groups // 2,
            "groups_mixed": mixed // 2,
            "reward_sum": 10.0,
            "mean_reward_window": 0.3,
            "unseen": 10,
        }
    ]
    return {
        "name": f"{sampler}-{seed}",
        "config": config,
        "steps": steps,
        "final": {
            "completions_reported": groups * 4,
            "effective_group_fraction": mixed / groups,
            "groups_mixed": mixed,
            "problems": 64,
            "unseen": 0,
            "reward_sum": groups * 2.0,
            "step": 9,
        },
        "accuracy_change": 0.05,
        "accuracy_change_ci95": [-0.02, 0.12],
        "forgetting_events": 1,
        "breakthroughs": 2,
    }


def test_arms_that_differ_beyond_the_sampler_are_refused():
    a, b = _report("heap", 0, 50, 100), _report("uniform", 0, 30, 100)
    check_arms([a, b])  # sampler, seed and run directory may differ
    check_arms([a, _report("uniform", 1, 30, 100)])
    for key, value in (("lr", 1e-4), ("dataset", "arithmetic:512"), ("rollouts", 800), ("group_size", 8)):
        other = copy.deepcopy(b)
        other["config"][key] = value
        with pytest.raises(InvalidArgument, match=f"differ in {key}"):
            check_arms([a, other])
    with pytest.raises(InvalidArgument, match="two runs of sampler heap with seed 0"):
        check_arms([a, copy.deepcopy(a)])


def test_summary_gives_per_arm_intervals_and_a_paired_ratio():
    runs = [run_metrics(_report(s, k, m + k, 100)) for k in range(3) for s, m in (("heap", 50), ("uniform", 30))]
    out = summarize(runs, ["heap", "uniform"])
    heap = out["arms"]["heap"]["effective_group_fraction"]
    assert heap["mean"] == pytest.approx(0.51) and heap["ci95"][0] < 0.51 < heap["ci95"][1]
    r = out["effective_group_fraction_ratio"]["heap"]
    assert r["vs"] == "uniform" and r["seeds"] == [0, 1, 2] and r["ratio"] == pytest.approx(0.51 / 0.31)
    assert r["above_1"] and r["ci95"][0] > 1
    assert runs[0]["mixed_groups_per_1000_rollouts"] == pytest.approx(1000 * 50 / 400)
    assert runs[0]["useful_rollouts"] == 200
    # a seed only one arm finished is left out of the ratio
    out = summarize(runs[:-1], ["heap", "uniform"])
    assert out["effective_group_fraction_ratio"]["heap"]["seeds"] == [0, 1]
    # one seed has no spread: no interval, and no claim that it is above 1
    one = summarize(runs[:2], ["heap", "uniform"])["effective_group_fraction_ratio"]["heap"]
    assert one["ci95"] is None and one["above_1"] is None
    assert "no interval" in summary_lines(summarize(runs[:2], ["heap", "uniform"]))[-1]
    alone = summary_lines(summarize(runs[:1], ["heap"]))  # one arm: its own figures, no ratio to a baseline
    assert alone and alone[0].startswith("heap") and "×" not in "".join(alone)


def test_default_arms_are_the_registry_default_then_heap_and_both_baselines():
    names = default_samplers()
    assert names[-3:] == ["heap", "dapo", "grpo"]
    assert len(names) == len(set(names))
    with pytest.raises(InvalidArgument, match="unknown sampler"):
        parse("compare", ["--samplers", "heap,nope"])
    # one arm alone runs (a plan's missing run, merged later with --runs); two names of one arm are a slip
    assert parse("compare", ["--samplers", "heap-prior", "--seed", "3", "--seeds", "1"]).samplers == ["heap-prior"]
    with pytest.raises(InvalidArgument, match="two or more"):
        parse("compare", ["--samplers", "heap,heap"])
    assert parse("compare", ["--samplers", "uniform,heap"]).samplers == ["dapo", "heap"]  # uniform is DAPO-style
    with pytest.raises(InvalidArgument, match="two or more"):
        parse("compare", ["--samplers", "uniform,dapo"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compare_runs_each_arm_and_writes_the_comparison(tmp_path):
    model = make_tiny_model(tmp_path / "tiny", seed=0)
    root = tmp_path / "cmp"
    cmd = [
        sys.executable,
        "-m",
        "prioreplay.apps.cli",
        "compare",
        "--model",
        str(model),
        "--dataset",
        "arithmetic:24",
        "--samplers",
        "heap,uniform",
        "--seeds",
        "1",
        "--rollouts",
        "48",
        "--eval-size",
        "4",
        "--batch-groups",
        "1",
        "--batch-size",
        "4",
        "--group-size",
        "4",
        "--max-new-tokens",
        "8",
        "--run-dir",
        str(root),
        "--timeout-s",
        "400",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=880)
    assert proc.returncode == 0, f"compare failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    out = json.loads((root / "compare.json").read_text())
    assert (root / "compare.png").stat().st_size > 10_000
    assert out["samplers"] == ["heap", "dapo"] and out["paired_seeds"] == [0]
    for s in ("heap", "dapo"):
        report = json.loads((root / f"{s}-seed0" / "report.json").read_text())  # a normal demo run directory
        assert report["config"]["sampler"] == {"dapo": "uniform"}.get(s, s) and report["config"]["rollouts"] == 48
        assert report["final"]["completions_reported"] >= 48
        assert "accuracy_change_ci95" in report and report["final"]["unseen"] <= 24
        # an arm keeps its final weights, not the optimizer state a resume needs (issue 43)
        arm = root / f"{s}-seed0" / "checkpoints"
        assert not list(arm.glob("step-*")) and report["disk"]["trainer_state_kept"] is False
        published = report["disk"]["published"]  # none when the arm never trained (the tiny model is never right)
        assert report["final_checkpoint"] is None
        assert report["final_weights"] == (str(arm / "published" / published[-1]) if published else None)
    run = out["runs"][0]
    for key in (
        "effective_group_fraction",
        "mixed_groups_per_1000_rollouts",
        "useful_rollouts",
        "mean_reward",
        "accuracy_change",
        "accuracy_change_ci95",
        "forgetting_events",
        "breakthroughs",
        "served_priority",
        "curve",
    ):
        assert key in run, key
    assert sum(run["served_priority"]["count"]) >= 12  # every served problem counted
    assert "heap" in out["effective_group_fraction_ratio"]
    assert "heap / dapo effective-group fraction" in proc.stdout

    # the finished runs compare again from their directories; a run with other settings is refused
    def compare_runs(out: str) -> subprocess.CompletedProcess:
        runs = ["--runs", str(root / "heap-seed0"), "--runs", str(root / "dapo-seed0")]
        args = [*cli("compare"), *runs, "--run-dir", str(tmp_path / out)]
        return subprocess.run(args, capture_output=True, text=True, timeout=120)

    again = compare_runs("again")
    assert again.returncode == 0, again.stderr
    changed = json.loads((root / "dapo-seed0" / "report.json").read_text())
    changed["config"]["lr"] = 1.0
    (root / "dapo-seed0" / "report.json").write_text(json.dumps(changed))
    refused = compare_runs("refused")
    assert refused.returncode == 2 and "differ in lr" in refused.stderr


def test_a_concurrent_arm_gets_exactly_the_settings_of_its_sequential_twin(tmp_path):
    from prioreplay.apps.compare import _arm_config, _demo_args

    cfg = parse("compare", ["--samplers", "heap,uniform", "--stop", "\\n", "--stop", "END", "--rollouts", "96"])
    arm = _arm_config(cfg, "dapo", 2, tmp_path)
    assert arm.stop == ["\n", "END"] and arm.run_dir == tmp_path / "dapo-seed2"
    assert parse("demo", _demo_args(arm)) == arm


def test_the_version_retest_arm_runs_heap_with_retest_versions_and_is_named_by_its_settings(tmp_path):
    from prioreplay.apps.compare import _arm_config, _demo_args

    cfg = parse("compare", ["--samplers", "heap,heap-version-retests,uniform", "--rollouts", "96"])
    assert cfg.samplers == ["heap", "heap-version-retests", "dapo"]
    arm = _arm_config(cfg, "heap-version-retests", 1, tmp_path)
    assert (arm.sampler, arm.retest_versions, arm.run_dir) == ("heap", 1, tmp_path / "heap-version-retests-seed1")
    assert parse("demo", _demo_args(arm)) == arm
    assert _arm_config(cfg, "heap", 1, tmp_path).retest_versions == 0
    # the runs: the same experiment but for the arm, told apart by the setting
    heap, versions = _report("heap", 0, 50, 100), _report("heap", 0, 55, 100, retest_versions=1)
    check_arms([heap, versions, _report("uniform", 0, 30, 100)])
    assert [run_metrics(r)["sampler"] for r in (heap, versions)] == ["heap", "heap-version-retests"]
    assert run_metrics(_report("heap", 0, 50, 100, retest_versions=3))["sampler"] == "heap-retest-versions-3"
    with pytest.raises(InvalidArgument, match="two runs of sampler heap-version-retests with seed 0"):
        check_arms([versions, copy.deepcopy(versions)])
    with pytest.raises(InvalidArgument, match="unknown sampler"):
        parse("compare", ["--samplers", "heap,heap-versions"])


def test_the_grpo_arm_trains_zero_variance_groups_and_dapo_drops_them(tmp_path):
    from prioreplay.apps.compare import _arm_config, _demo_args
    from prioreplay.apps.demo import _learner_args

    cfg = parse("compare", ["--samplers", "grpo,dapo,heap", "--rollouts", "96"])
    grpo, dapo = _arm_config(cfg, "grpo", 0, tmp_path), _arm_config(cfg, "dapo", 0, tmp_path)
    assert (grpo.sampler, grpo.queue_zero_variance, grpo.train_zero_variance) == ("uniform", True, True)
    assert (dapo.sampler, dapo.queue_zero_variance, dapo.train_zero_variance) == ("uniform", False, False)
    assert parse("demo", _demo_args(grpo)) == grpo
    assert "--train-zero-variance" in _learner_args(grpo, tmp_path, "a:1", tmp_path, 1)
    assert "--train-zero-variance" not in _learner_args(dapo, tmp_path, "a:1", tmp_path, 1)
    # runs are told apart by the settings; a uniform run made before the settings existed stays "uniform"
    g = _report("uniform", 0, 30, 100, queue_zero_variance=True, train_zero_variance=True)
    d = _report("uniform", 0, 30, 100, queue_zero_variance=False, train_zero_variance=False)
    check_arms([g, d])
    assert [run_metrics(r)["sampler"] for r in (g, d, _report("uniform", 0, 30, 100))] == ["grpo", "dapo", "uniform"]


def test_the_evidence_arm_is_told_apart_from_version_retests():
    base = dict(retest_versions=1, queue_zero_variance=False, train_zero_variance=False, age_decay=1.0)
    ev = _report("heap", 0, 30, 100, **{**base, "pool_evidence": 0})
    vr = _report("heap", 0, 30, 100, **{**base, "pool_evidence": 1})
    assert [run_metrics(r)["sampler"] for r in (ev, vr)] == ["heap-evidence", "heap-version-retests"]
    odd = _report("heap", 0, 30, 100, pool_evidence=2, age_decay=0.9)
    assert run_metrics(odd)["sampler"] == "heap-pool-evidence-2-age-decay-0.9"
    fresh = _report("heap", 0, 30, 100, heap_age_decay=0.95)
    assert run_metrics(fresh)["sampler"] == "heap-heap-age-decay-0.95"  # heap priorities aged between reports
    prior = _report("heap", 0, 30, 100, unseen_prior="fit")
    assert run_metrics(prior)["sampler"] == "heap-prior"  # unseen problems at the fitted prior
    assert run_metrics(_report("heap", 0, 30, 100, unseen_prior="0.1"))["sampler"] == "heap-unseen-prior-0.1"


def test_the_prior_arm_runs_heap_with_the_fitted_prior_and_the_demo_passes_it_to_the_server(tmp_path):
    from prioreplay.apps.compare import _arm_config, _demo_args

    cfg = parse("compare", ["--samplers", "heap,heap-prior", "--rollouts", "96"])
    heap, prior = _arm_config(cfg, "heap", 0, tmp_path), _arm_config(cfg, "heap-prior", 0, tmp_path)
    assert (heap.sampler, heap.unseen_prior, prior.sampler, prior.unseen_prior) == ("heap", "off", "heap", "fit")
    assert parse("demo", _demo_args(prior)) == prior


def test_rollouts_to_target_is_read_off_the_held_out_curves_against_grpo_and_dapo():
    def run(arm, seed, accs):
        curve = [{"rollouts": 100 * i, "accuracy": a} for i, a in enumerate(accs)]
        return {"sampler": arm, "seed": seed, "heldout_curve": curve}

    by_arm = {
        "grpo": {s: run("grpo", s, [0.1, 0.2, 0.3, 0.4, 0.5]) for s in (0, 1)},  # target 0.5 at 400
        "dapo": {s: run("dapo", s, [0.1, 0.3, 0.4, 0.5, 0.5]) for s in (0, 1)},  # at 300
        "heap": {s: run("heap", s, [0.1, 0.5, 0.5, 0.5, 0.5]) for s in (0, 1)},  # at 100
        "old": {0: run("old", 0, [0.1, 0.5])},  # too few points: left out
    }
    out = rollouts_to_target(by_arm, ["grpo", "dapo", "heap", "old"], target_fraction=1.0)
    assert out["heap_vs_grpo"]["ratio"] == pytest.approx(4.0) and out["heap_vs_dapo"]["ratio"] == pytest.approx(3.0)
    assert out["dapo_vs_grpo"]["ratio"] == pytest.approx(4 / 3) and "old_vs_grpo" not in out
    assert rollouts_to_target(by_arm, ["dapo", "heap"]) == {}  # no grpo arm: no target
    with pytest.raises(ValueError, match="target_fraction"):
        rollouts_to_target(by_arm, ["grpo", "heap"], target_fraction=0.0)


def test_with_a_2r_budget_the_target_is_grpos_accuracy_at_r_and_the_plateau_is_read_at_2r():
    def run(arm, seed, accs, after):
        curve = [{"rollouts": 100 * i, "accuracy": a} for i, a in enumerate(accs)]
        return {"sampler": arm, "seed": seed, "heldout_curve": curve, "rollout_budget": 800, "accuracy_after": after}

    # grpo reaches 0.4 at R = 400 (half of the 800 budget) and 0.6 at 2R; heap reaches 0.4 at 200
    by_arm = {
        "grpo": {s: run("grpo", s, [0.1, 0.2, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6], 0.6) for s in (0, 1, 2)},
        "heap": {s: run("heap", s, [0.1, 0.3, 0.4, 0.45, 0.5, 0.5, 0.5, 0.5, 0.5], 0.5 - 0.01 * s) for s in (0, 1, 2)},
    }
    half = rollouts_to_target(by_arm, ["grpo", "heap"], target_fraction=0.5)["heap_vs_grpo"]
    assert half["targets"] == [pytest.approx(0.4)] * 3 and half["ratio"] == pytest.approx(2.0) and half["censored"] == 0
    full = rollouts_to_target(by_arm, ["grpo", "heap"], target_fraction=1.0)["heap_vs_grpo"]
    assert full["targets"] == [pytest.approx(0.6)] * 3 and full["censored"] == 3  # heap never reaches 0.6: a plateau
    plateau = final_vs_grpo(by_arm, ["grpo", "heap"])["heap"]
    assert plateau["per_seed"] == pytest.approx([-0.1, -0.11, -0.12]) and plateau["below_grpo"] is True
    assert "grpo" not in final_vs_grpo(by_arm, ["grpo", "heap"]) and final_vs_grpo({"heap": by_arm["heap"]}, ["heap"]) == {}


def test_the_target_is_fixed_apart_from_the_arms_compared():
    def run(arm, seed, accs):
        curve = [{"rollouts": 100 * i, "accuracy": a} for i, a in enumerate(accs)]
        return {"sampler": arm, "seed": seed, "heldout_curve": curve, "rollout_budget": 800}

    rise = [0.1, 0.2, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6]
    by_arm = {
        "grpo": {0: run("grpo", 0, rise), 1: run("grpo", 1, [a + 0.1 for a in rise]), 2: run("grpo", 2, rise)},
        "heap": {s: run("heap", s, [0.1, 0.3, 0.4, 0.45, 0.5, 0.5, 0.5, 0.5, 0.5]) for s in (0, 1, 2)},
    }
    from prioreplay.apps.compare_target import target_summary

    summary = {"target": target_summary(by_arm, 0.5, None), "rollouts_to_target": rollouts_to_target(by_arm, ["grpo", "heap"])}
    assert summary["target"]["kind"] == "leave_one_out"  # the default: grpo's other seeds at R
    assert summary["target"]["per_seed"] == pytest.approx({0: 0.45, 1: 0.4, 2: 0.45})
    r = summary["rollouts_to_target"]["heap_vs_grpo"]
    assert r["targets"] == pytest.approx([0.45, 0.4, 0.45]) and r["interval"] == "t on per-seed log ratios"
    fixed = rollouts_to_target(by_arm, ["grpo", "heap"], target_accuracy=0.5)["heap_vs_grpo"]
    assert fixed["targets"] == [0.5] * 3 and fixed["censored"] == 0
    never = rollouts_to_target(by_arm, ["grpo", "heap"], target_accuracy=0.58)["heap_vs_grpo"]
    assert never["censored_arm"] == [0, 1, 2] and never["bound"] == "upper"  # heap tops out at 0.5
    bare = {"arms": {}, "effective_group_fraction_ratio": {}, **summary}
    lines = summary_lines({**bare, "rollouts_to_target": {"heap_vs_grpo": never}})
    assert any("an upper bound" in line and "over its other seeds" in line for line in lines)
    one = {"grpo": {0: by_arm["grpo"][0]}, "heap": {0: by_arm["heap"][0]}}
    assert rollouts_to_target(one, ["grpo", "heap"]) == {}  # one grpo seed: no other seed to fix a target
    assert rollouts_to_target(one, ["grpo", "heap"], target_accuracy=0.4)["heap_vs_grpo"]["seeds"] == [0]


def test_a_run_made_before_a_setting_existed_compares_with_one_at_its_default():
    old = _report("heap", 0, 30, 100)  # no eval_points key
    check_arms([old, _report("heap", 1, 30, 100, eval_points=0)])
    with pytest.raises(InvalidArgument, match="differ in eval_points"):
        check_arms([old, _report("heap", 1, 30, 100, eval_points=3)])


def test_an_arm_with_a_correction_suffix_runs_the_learner_with_that_correction(tmp_path):
    from prioreplay.apps.compare import _arm_config, _demo_args
    from prioreplay.apps.demo import _learner_args

    cfg = parse("compare", ["--samplers", "heap+icepop,heap+tis,heap+none,dapo+none", "--kl-coef", "0.001"])
    assert cfg.samplers == ["heap+icepop", "heap", "heap+none", "dapo+none"]  # the default correction carries no suffix
    icepop, dapo = _arm_config(cfg, "heap+icepop", 2, tmp_path), _arm_config(cfg, "dapo+none", 2, tmp_path)
    assert (icepop.sampler, icepop.off_policy_correction, icepop.run_dir) == ("heap", "icepop", tmp_path / "heap+icepop-seed2")
    assert (dapo.sampler, dapo.queue_zero_variance, dapo.off_policy_correction) == ("uniform", False, "none")
    assert _arm_config(cfg, "heap", 2, tmp_path).off_policy_correction == "tis"
    assert parse("demo", _demo_args(icepop)) == icepop
    args = _learner_args(icepop, tmp_path, "a:1", tmp_path, 1)
    assert args[args.index("--off-policy-correction") + 1] == "icepop"
    assert args[args.index("--kl-coef") + 1] == "0.001"
    # the runs are told apart by the correction, and a run made before the setting existed ran the default
    runs = [_report("heap", 0, 30, 100, off_policy_correction=c) for c in ("icepop", "tis", "none")]
    check_arms([*runs, _report("heap", 1, 30, 100)])
    assert [run_metrics(r)["sampler"] for r in (*runs, _report("heap", 1, 30, 100))] == [
        "heap+icepop",
        "heap",
        "heap+none",
        "heap",
    ]
    # a compare run with another correction names its plain arms by it
    assert parse("compare", ["--samplers", "heap,heap+tis", "--off-policy-correction", "none"]).samplers == ["heap+none", "heap"]
    with pytest.raises(InvalidArgument, match=r"must be an off-policy correction, one of none, tis"):
        parse("compare", ["--samplers", "heap+tsi,heap"])
    with pytest.raises(InvalidArgument, match="unknown sampler"):
        parse("compare", ["--samplers", "heep+tis,heap"])
    with pytest.raises(InvalidArgument, match="two or more different samplers"):
        parse("compare", ["--samplers", "heap,heap+tis"])


def test_the_demo_namespace_of_an_arm_with_a_correction_suffix_is_a_valid_namespace(tmp_path):
    import re

    from prioreplay.apps.demo_config import namespace_for

    ns = namespace_for(tmp_path / "heap+icepop-seed0")
    assert ns.startswith("demo-heap_icepop-seed0-") and re.fullmatch(r"[A-Za-z0-9_.:-]{1,128}", ns)
    assert len(namespace_for(tmp_path / ("x" * 300))) <= 128


def test_the_heap_grpo_arm_and_every_arms_trained_share(tmp_path):
    """heap-grpo is the heap with GRPO's training rule; compare.json and the printed lines give each
    arm's trained share (trained / queued for the learner), and every arm runs under the pace bound."""
    from prioreplay.apps.compare import _arm_config, _demo_args

    cfg = parse("compare", ["--samplers", "grpo,dapo,heap-grpo", "--rollouts", "96"])
    assert cfg.samplers == ["grpo", "dapo", "heap-grpo"] and cfg.pace_batches == 1
    arm = _arm_config(cfg, "heap-grpo", 0, tmp_path)
    assert (arm.sampler, arm.queue_zero_variance, arm.train_zero_variance, arm.pace_batches) == ("heap", True, True, 1)
    assert parse("demo", _demo_args(arm)) == arm
    runs = []
    for k in range(2):
        for name, share in (("heap", 0.9 + 0.02 * k), ("uniform", 0.95)):
            extra = {"queue_zero_variance": True, "train_zero_variance": True} if name == "heap" else {}
            rep = _report(name, k, 40, 100, pace_batches=1, **extra)
            rep["groups"] = {"generated": 100, "queued": 100, "trained": int(100 * share), "trained_share": share}
            runs.append(run_metrics(rep))
    assert {r["sampler"] for r in runs} == {"heap-grpo", "uniform"}
    out = summarize(runs, ["heap-grpo", "uniform"])
    assert out["arms"]["heap-grpo"]["trained_share"]["mean"] == pytest.approx(0.91)
    assert "trained share 91%" in summary_lines(out)[0]
    assert run_metrics(_report("heap", 0, 40, 100))["trained_share"] is None  # a run from before the counting


def test_an_unpaced_run_from_before_the_pace_bound_is_not_compared_with_a_paced_one():
    old, new = _report("heap", 0, 30, 100), _report("heap", 1, 30, 100, pace_batches=1)
    with pytest.raises(InvalidArgument, match="differ in pace_batches"):
        check_arms([old, new])
    check_arms([old, _report("heap", 1, 30, 100, pace_batches=0)])
