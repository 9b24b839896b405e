"""``benchmarks.offpolicy_runs``: the learner figures of one run, worked by hand, and the per-arm
summary of a comparison whose arms differ by the learner's correction."""

from __future__ import annotations

import json

import pytest

from benchmarks.offpolicy_runs import learner_figures, main, result_items, summarize_dir, table


def _lines() -> list[dict]:
    return [
        {
            "step": 1,
            "groups_pulled": 4,
            "groups_stale": 1,
            "kl": 0.0,
            "grad_norm": 0.5,
            "mismatch_kl": 0.01,
            "is_masked_frac": 0.0,
            "mismatch_kl_age_0": 0.01,
        },
        {"step": 1, "skipped": "non-finite", "grad_norm": float("nan"), "kl": float("nan")},
        {"step": 2, "kl": 0.002, "grad_norm": 3.0, "mismatch_kl": 0.03, "is_masked_frac": 0.1, "mismatch_kl_age_3": 0.05},
    ]


def test_the_learner_figures_of_a_run_are_the_hand_worked_shares_and_means():
    f = learner_figures(_lines(), max_grad_norm=1.0)
    assert f["kl_ref_last"] == 0.002  # the last trained step, not the skipped one
    assert (f["grad_norm_mean"], f["grad_norm_max"]) == (1.75, 3.0)
    assert f["clipped_share"] == pytest.approx(1 / 3) and f["nonfinite_share"] == pytest.approx(1 / 3)
    assert f["mismatch_kl_mean"] == pytest.approx(0.02) and f["masked_frac_mean"] == pytest.approx(0.05)
    assert f["truncated_frac_mean"] is None and f["policy_age_max"] == 3.0
    assert (f["trained_steps"], f["stale_group_share"]) == (2.0, 0.25)
    with pytest.raises(ValueError, match="no learner step"):
        learner_figures([])


def _run(root, correction: str, seed: int, accuracy: list[float], grad_norm: float) -> None:
    d = root / (("heap" if correction == "tis" else f"heap+{correction}") + f"-seed{seed}")
    d.mkdir()
    n = 32
    report = {
        "name": d.name,
        "config": {"sampler": "heap", "seed": seed, "group_size": 4, "off_policy_correction": correction, "rollouts": 256},
        "steps": [],
        "final": {"completions_reported": 256, "effective_group_fraction": 0.5, "groups_mixed": 32, "problems": 64},
        "heldout_curve": [{"rollouts": r, "accuracy": a} for r, a in zip((0, 128, 256), accuracy, strict=True)],
        "accuracy_after": accuracy[-1],
        "accuracy_after_each": [i < accuracy[-1] * n for i in range(n)],
    }
    (d / "report.json").write_text(json.dumps(report))
    lines = [{"step": s, "kl": 0.001 * s, "grad_norm": grad_norm, "mismatch_kl": 0.01} for s in (1, 2)]
    (d / "learner.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def test_a_comparison_is_summarized_per_arm_with_intervals_and_against_the_last_arm(tmp_path, capsys):
    for seed in (0, 1):
        _run(tmp_path, "icepop", seed, [0.25, 0.3, 0.5 + 0.125 * seed], 0.5)
        _run(tmp_path, "none", seed, [0.25, 0.25, 0.25 + 0.125 * seed], 2.0)
    (tmp_path / "compare.json").write_text(json.dumps({"samplers": ["heap+icepop", "heap+none"]}))
    s = summarize_dir(tmp_path)
    assert s["baseline"] == "heap+none" and list(s["arms"]) == ["heap+icepop", "heap+none"]
    icepop, none = s["arms"]["heap+icepop"], s["arms"]["heap+none"]
    assert icepop["heldout_point2"]["values"] == [0.5, 0.625] and icepop["heldout_point2"]["rollouts"] == [256, 256]
    assert icepop["heldout_change_vs_heap+none"]["values"] == [0.25, 0.25]
    assert icepop["kl_ref_last"]["mean"] == pytest.approx(0.002)
    assert (icepop["clipped_share"]["mean"], none["clipped_share"]["mean"]) == (0.0, 1.0)
    rows = table(s)
    assert rows[2].startswith("| `heap+icepop` | 2 | 2.0 | 25.0") and "+25.0" in rows[2]
    items = {i["name"]: i for i in result_items(s, "prioreplay compare ...", "load 1.0")}
    item = items["offpolicy.run.heap+none.grad_norm_mean"]
    assert (item["value"], item["seeds"], item["note"]) == (2.0, [0, 1], "load 1.0")
    out = tmp_path / "results.json"
    assert main([str(tmp_path), "--out", str(out), "--command", "prioreplay compare X"]) == 0
    written = json.loads(out.read_text())
    assert {i["name"] for i in written} == set(items) and "`heap+none`" in capsys.readouterr().out
