"""The per-task breakdown: report tables from made-up outcome lines, the bounded label set, and the
worker's and server's per-task counters."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from prioreplay.apps.pool_audit import summarize
from prioreplay.apps.task_report import by_task_lines, scrape_served_by_task, task_breakdown
from prioreplay.errors import InvalidArgument
from prioreplay.problems import OTHER_TASK, ProblemRecord, TaskLabels, problem_task

ROWS = [
    {"problem_id": "a1", "task": "sums", "rewards": [1, 1, 1, 1]},
    {"problem_id": "a2", "task": "sums", "rewards": [1, 0, 1, 1]},
    {"problem_id": "b1", "task": "puzzles", "rewards": [0, 0, 0, 0]},
    {"problem_id": "a1", "task": "sums", "rewards": [1, 0, 0, 0]},  # a revisit: counted, not a first visit
    {"problem_id": "c1", "rewards": [0.0, 1.0]},  # an old line without a task
]


def test_pass_rate_and_group_kinds_per_task_with_first_visits_apart():
    t = task_breakdown(ROWS)
    assert list(t) == ["default", "puzzles", "sums"]
    sums = t["sums"]
    assert (sums["groups"], sums["completions"], sums["pass_rate"]) == (3, 12, 8 / 12)
    assert (sums["mixed_fraction"], sums["all_correct_fraction"], sums["all_wrong_fraction"]) == (2 / 3, 1 / 3, 0.0)
    assert sums["first_visit"] == {"groups": 2, "mixed_fraction": 0.5, "all_wrong_fraction": 0.0, "all_correct_fraction": 0.5}
    assert t["puzzles"]["first_visit"]["all_wrong_fraction"] == 1.0 and t["puzzles"]["pass_rate"] == 0.0
    assert t["default"]["pass_rate"] == 0.5
    assert "served" not in sums


def test_served_counts_and_mean_priority_come_from_the_server_scrape():
    text = (
        "# HELP prioreplay_task_sampled_total x\n# TYPE prioreplay_task_sampled_total counter\n"
        'prioreplay_task_sampled_total{task="sums"} 4\nprioreplay_task_sampled_total{task="never-reported"} 2\n'
        "# HELP prioreplay_task_sampled_priority_total x\n# TYPE prioreplay_task_sampled_priority_total counter\n"
        'prioreplay_task_sampled_priority_total{task="sums"} 0.5\n'
        'prioreplay_task_sampled_priority_total{task="never-reported"} 0.5\n'
    )
    served = scrape_served_by_task(text)
    assert served == {"sums": {"served": 4.0, "priority_sum": 0.5}, "never-reported": {"served": 2.0, "priority_sum": 0.5}}
    t = task_breakdown(ROWS, served)
    assert (t["sums"]["served"], t["sums"]["mean_served_priority"]) == (4, 0.125)
    assert t["never-reported"] == {"served": 2, "mean_served_priority": 0.25}
    assert scrape_served_by_task("") == {}


def test_the_report_folds_tasks_past_the_cap_into_other():
    rows = [{"problem_id": f"p{i}", "task": f"t{i}", "rewards": [1, 0]} for i in range(5)]
    t = task_breakdown(rows, limit=2)
    assert set(t) == {"t0", "t1", OTHER_TASK}
    assert t[OTHER_TASK]["groups"] == 3
    with pytest.raises(InvalidArgument, match="limit"):
        task_breakdown(rows, limit=0)


def test_summary_lines_only_for_several_tasks():
    lines = by_task_lines(task_breakdown(ROWS))
    assert lines[0].startswith("by task") and len(lines) == 4
    assert any("sums" in line and "67%" in line for line in lines)
    assert by_task_lines(task_breakdown(ROWS[:2])) == [] and by_task_lines(None) == []


def test_task_labels_keep_the_first_ones_and_fold_the_rest():
    labels = TaskLabels(limit=2)
    assert [labels.label(t) for t in ["a", "b", "c", "a", OTHER_TASK, "b"]] == ["a", "b", OTHER_TASK, "a", OTHER_TASK, "b"]
    roomy = TaskLabels()
    assert roomy.label("x" * 65) == OTHER_TASK and roomy.label("a\nb") == OTHER_TASK and roomy.label("x" * 64) == "x" * 64
    with pytest.raises(InvalidArgument, match=r"task label limit \(0\) must be >= 1"):
        TaskLabels(0)


def test_a_problem_task_falls_back_to_source_then_verifier():
    p = ProblemRecord(id="x", prompt="q", answer="1", verifier="gsm8k", metadata={"source": "arithmetic"})
    assert problem_task(p) == "arithmetic"
    assert problem_task(ProblemRecord(id="x", prompt="q", answer="1", verifier="math")) == "math"
    assert problem_task(ProblemRecord(id="x", prompt="q", answer="1", metadata={"task": "t", "source": "s"})) == "t"


def test_worker_counts_completions_and_passes_per_capped_task():
    from prioreplay.rollout_worker.metrics import WorkerMetrics

    m = WorkerMetrics()
    m.task_labels = TaskLabels(limit=1)
    m.observe_tasks(["sums", "puzzles", "sums"], [[1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0]])
    text = generate_latest(m.registry).decode()
    assert 'prioreplay_worker_task_completions_total{task="sums"} 4.0' in text
    assert 'prioreplay_worker_task_passed_total{task="sums"} 3.0' in text
    assert 'prioreplay_worker_task_completions_total{task="other"} 3.0' in text
    assert 'task="puzzles"' not in text
    with pytest.raises(ValueError):
        m.observe_tasks(["sums"], [[1.0], [0.0]])  # one task per group
    m.observe_tasks(["sums"], [[0.7, 0.2]], [[True, False]])  # plugin rewards: their pass flags count
    assert m.registry.get_sample_value("prioreplay_worker_task_passed_total", {"task": "sums"}) == 4.0


def test_plugin_pass_flags_decide_the_report_pass_rate():
    rows = [{"problem_id": "a", "task": "fmt", "rewards": [0.7, 0.7, 0.2], "passed": [True, True, False]}]
    assert task_breakdown(rows)["fmt"]["pass_rate"] == 2 / 3


def test_server_counts_served_problems_and_their_priority_per_task():
    from prioreplay.priority_server.metrics import ServerMetrics

    m = ServerMetrics()
    m.observe_sampled([0.25, 0.1, 0.2], 0, ["sums", "puzzles", "sums"])
    m.observe_sampled([0.05])  # a caller without tasks: the histogram only
    text = generate_latest(m.registry).decode()
    assert 'prioreplay_task_sampled_total{task="sums"} 2.0' in text
    assert 'prioreplay_task_sampled_priority_total{task="sums"} 0.45' in text
    assert scrape_served_by_task(text)["puzzles"] == {"served": 1.0, "priority_sum": 0.1}


def test_pool_audit_breaks_misfiled_problems_down_by_task():
    def prob(i, task):
        return ProblemRecord(id=f"p{i}", prompt="q", answer="1", metadata={"task": task})

    pools = {"solved": [prob(0, "sums"), prob(1, "sums")], "unsolved": [prob(2, "puzzles")]}
    out = summarize(pools, {"p0": [1, 1], "p1": [1, 0], "p2": [0, 0]})
    assert out["by_task"] == {
        "sums": {"solved": {"pooled": 2, "misfiled": 1}},
        "puzzles": {"unsolved": {"pooled": 1, "misfiled": 0}},
    }


def test_the_run_report_gains_by_task_from_the_outcomes_and_the_served_scrape(tmp_path, monkeypatch, capsys):
    import json
    from types import SimpleNamespace

    from prioreplay.apps import report_figure
    from prioreplay.apps.demo_report import OUTCOMES_FILE, write_report

    monkeypatch.setattr(report_figure, "render", lambda report, path: path)  # the picture is tested elsewhere
    (tmp_path / OUTCOMES_FILE).write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    served = {"le": [0.25], "count": [3.0], "by_task": {"sums": {"served": 2.0, "priority_sum": 0.3}}}
    final = SimpleNamespace(
        effective_group_fraction=0.5, completions_reported=18, heap_size=1, solved=1, unsolved=1, unseen=0, problems=3
    )
    final.forgetting_events = 0
    final.__dict__.update(groups_mixed=3, groups_all_correct=1, groups_all_wrong=0, groups_constant=0)
    final.__dict__.update(groups_acked=3, queue_depth=0, pending_groups=0)  # where the groups went (no learner log)
    write_report(tmp_path, {"served_priority": served, "eval_size": 0}, final)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["by_task"]["sums"]["pass_rate"] == 8 / 12
    assert report["by_task"]["sums"]["mean_served_priority"] == pytest.approx(0.15)
    assert "  sums" in capsys.readouterr().out
