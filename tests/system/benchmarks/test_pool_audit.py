"""What a run pays and how true its pools are: token counts, the pool audit, the arms against the baseline.

The pure parts (misfiled rule, audit summary, comparison against the baseline, token totals) run
without processes; the end-to-end test runs the real demo on a tiny random Llama with a token
budget (reductions: 24 problems, leases of 4, G = 4, 8 new tokens, 2 held-out problems).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from prioreplay.apps.compare import against_baseline, run_metrics, summarize, summary_lines
from prioreplay.apps.demo_report import token_totals, tokens_line
from prioreplay.apps.pool_audit import audit_line, misfiled, pool_clock, pooled_problems
from prioreplay.apps.pool_audit import summarize as audit_summary
from prioreplay.errors import InvalidArgument
from prioreplay.problems import ProblemRecord
from prioreplay.rules import Pool, Stats
from prioreplay.tiny_model import make_tiny_model


def test_a_pooled_problem_is_misfiled_when_the_policy_now_gives_a_mixed_or_opposite_group():
    assert misfiled("unsolved", [0, 0, 1, 0]) and not misfiled("unsolved", [0, 0, 0, 0])
    assert misfiled("solved", [1, 1, 0, 1]) and not misfiled("solved", [1, 1, 1, 1])
    assert misfiled("solved", [0, 0, 0, 0]) and misfiled("unsolved", [1, 1, 1, 1])
    with pytest.raises(InvalidArgument, match="pool"):
        misfiled("heap", [1, 0])
    with pytest.raises(InvalidArgument, match="at least one reward"):
        misfiled("solved", [])


def test_the_audit_reads_the_pools_from_a_snapshot_and_counts_per_pool(tmp_path):
    from prioreplay.priority_server.store import snapshot
    from prioreplay.priority_server.store.snapshot import Entry, MemoryState

    state = MemoryState()
    homes = {"a": Pool.SOLVED, "b": Pool.UNSOLVED, "c": Pool.UNSOLVED, "d": Pool.HEAP}
    for pid, home in homes.items():
        rec = ProblemRecord(id=pid, prompt=f"q {pid}", answer="1", verifier="gsm8k", metadata={})
        pool = Pool.LEASED if pid == "c" else home  # a leased problem counts where it returns
        state.problems[pid] = Entry(rec, pid, Stats(4, 0, 0), pool, home, 0.0)
    path = tmp_path / "snap.json"
    snapshot.write_atomic(path, snapshot.encode(state))
    pools = pooled_problems(path)
    assert [p.id for p in pools["solved"]] == ["a"] and [p.id for p in pools["unsolved"]] == ["b", "c"]
    out = audit_summary(pools, {"a": [1, 1, 1, 0], "b": [0, 0, 0, 0], "c": [0, 1, 0, 0]})
    assert out["pooled"] == 3 and out["misfiled"] == 2 and out["misfiled_share"] == pytest.approx(2 / 3)
    assert out["unsolved"]["misfiled"] == 1 and out["solved"]["misfiled_share"] == 1.0
    assert sorted(out["misfiled_ids"]) == ["a", "c"]
    out.update(group_size=4)
    assert "2 of 3 pooled problems misfiled (67%, 95% CI [" in audit_line(out)
    lo, hi = out["misfiled_ci95"]
    assert lo < 2 / 3 < hi
    # the lost opportunity share: misfiled problems' time since their last test over problems x clock
    state.step = 10
    state.problems["a"].score = 4.0  # solved at step 4, misfiled: 6 steps lost
    state.problems["c"].score = 9.0  # 1 step
    snapshot.write_atomic(path, snapshot.encode(state))
    ages, n, now = pool_clock(path)
    assert (ages, n, now) == ({"a": 6.0, "b": 10.0, "c": 1.0}, 4, 10.0)
    lost = audit_summary(pools, {"a": [1, 1, 1, 0], "b": [0, 0, 0, 0], "c": [0, 1, 0, 0]}, (ages, n, now))
    assert lost["lost_opportunity_share"] == pytest.approx(7 / 40)
    assert "not run (Redis)" in audit_line({"skipped": "Redis"})
    with pytest.raises(InvalidArgument, match="not a memory-store snapshot"):
        pooled_problems(tmp_path / "missing.json")


def _run(sampler: str, seed: int, useful: int, after: list[bool], misfiled_share: float) -> dict:
    return {
        "name": f"{sampler}-{seed}",
        "config": {"sampler": sampler, "seed": seed, "group_size": 4},
        "steps": [],
        "final": {"completions_reported": 400, "effective_group_fraction": 0.5, "groups_mixed": 50, "problems": 64},
        "tokens": {"completion_tokens": 8000, "prompt_tokens": 20000, "useful_tokens": useful},
        "pool_audit": {"misfiled_share": misfiled_share, "pooled": 10, "misfiled": int(10 * misfiled_share)},
        "accuracy_after": sum(after) / len(after),
        "eval_correct_after": after,
        "duration_s": 100.0,
    }


def test_arms_are_compared_with_the_baseline_at_equal_completion_tokens():
    reports = []
    for k in range(3):
        reports.append(_run("heap", k, 4000 + 400 * k, [True] * (7 + k // 2) + [False] * (3 - k // 2), 0.2))
        reports.append(_run("uniform", k, 2000 + 100 * k, [True] * 5 + [False] * 5, 0.4 + 0.05 * k))
    runs = [run_metrics(r) for r in reports]
    assert runs[0]["useful_token_fraction"] == pytest.approx(0.5) and runs[0]["wall_clock_s"] == 100.0
    assert runs[0]["curve"][-1]["completion_tokens"] == 8000
    out = summarize(runs, ["heap", "uniform"])
    v = out["vs_baseline"]["heap"]
    assert v["seeds"] == [0, 1, 2]
    assert v["useful_tokens_ratio"]["per_seed"] == pytest.approx([2.0, 4400 / 2100, 4800 / 2200])
    assert v["useful_tokens_ratio"]["ci95"][0] > 1.0
    assert v["heldout_change"]["per_seed"] == pytest.approx([0.2, 0.2, 0.3])
    assert v["heldout_change"]["ci95"][0] > 0 and len(v["heldout_change"]["pooled_ci95"]) == 2
    assert v["pool_misfiled_share_change"]["mean"] == pytest.approx(-0.25)
    text = "\n".join(summary_lines(out))
    assert "heap vs uniform over seeds [0, 1, 2]: useful tokens per completion token" in text
    assert "pool misfiled" in text and "completion tokens 8,000" in text
    # one seed: figures without intervals; a run without token counts gives None, not a crash
    one = against_baseline({0: runs[0]}, {0: runs[1]}, [0])
    assert one["useful_tokens_ratio"]["ci95"] is None and one["heldout_change"]["ci95"] is None
    old = dict(reports[0], tokens={})
    assert run_metrics(old)["completion_tokens"] is None and run_metrics(old)["useful_token_fraction"] is None


def test_token_totals_sum_the_workers_counters():
    metrics = {
        "worker-0": {"prioreplay_worker_tokens_generated_total": 100.0, "prioreplay_worker_useful_tokens_total": 40.0},
        "worker-1": {"prioreplay_worker_tokens_generated_total": 50.0, "prioreplay_worker_prompt_tokens_total": 300.0},
    }
    assert token_totals(metrics) == {"completion_tokens": 150, "prompt_tokens": 300, "useful_tokens": 40}
    line = tokens_line({"tokens": token_totals(metrics), "duration_s": 12.0})
    assert "150 completion (40 useful" in line and "27%" in line and "12 s" in line


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_demo_run_reports_its_tokens_and_audits_its_pools(tmp_path):
    model = make_tiny_model(tmp_path / "tiny", seed=0)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "prioreplay.apps.cli", "demo", "--model", str(model), "--dataset", "arithmetic:24"]
    cmd += ["--rollouts", "0", "--completion-tokens", "300", "--eval-size", "2", "--batch-groups", "1", "--batch-size", "4"]
    cmd += ["--group-size", "4", "--max-new-tokens", "8", "--run-dir", str(run_dir), "--timeout-s", "400"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=560)
    assert proc.returncode == 0, f"demo failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    report = json.loads((run_dir / "report.json").read_text())
    tokens = report["tokens"]
    # the token budget ended the run. The demo reads the workers' counters once a second and
    # pipelined workers finish the leases they hold, so a model this fast overshoots by several
    # leases; the bound is what ended the run, not how closely
    assert tokens["completion_tokens"] >= 300
    assert "budget reached" in proc.stdout + proc.stderr
    assert 0 <= tokens["useful_tokens"] <= tokens["completion_tokens"] and tokens["prompt_tokens"] > 0
    assert all("completion_tokens" in s for s in report["steps"])
    audit = report["pool_audit"]
    final = report["final"]
    # every pooled problem scored (a problem still leased at the end counts in the pool it returns to)
    assert final["solved"] + final["unsolved"] <= audit["pooled"] <= final["solved"] + final["unsolved"] + final["leased"]
    assert audit["completions"] == 4 * audit["pooled"]
    assert "tokens generated:" in proc.stdout and "pool audit" in proc.stdout


def test_the_tiers_mix_draws_each_tier_about_a_third_of_the_time_and_labels_it():
    from collections import Counter

    from prioreplay.datasets import iter_problems

    problems = list(iter_problems("arithmetic:600:0:tiers"))
    tiers = Counter(p.metadata["tier"] for p in problems)
    assert set(tiers) == {"trivial", "easy", "hard"} and all(150 <= n <= 250 for n in tiers.values())
    for p in problems[:50]:
        a, op, b = p.prompt.split()[1:4]
        if p.metadata["tier"] == "trivial":
            assert op == "+" and len(a) == len(b.rstrip(".")) == 1
        if p.metadata["tier"] == "hard":
            assert op == "*" and (len(a), len(b.rstrip("."))) == (3, 2) and int(p.answer) == int(a) * int(b.rstrip("."))
    assert [p.id for p in iter_problems("arithmetic:10:0:tiers")] == [p.id for p in problems[:10]]  # a prefix
