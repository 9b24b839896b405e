"""The demo's held-out summary: never a before/after without the interval of the change; the
report picture draws the intervals and the unseen count."""

from __future__ import annotations

from prioreplay.apps.demo_report import held_out_line, held_out_summary, scrape_histogram


def test_summary_line_gives_the_change_with_its_interval_and_says_if_it_excludes_zero():
    before = [True] * 10 + [False] * 118
    flat = held_out_summary(before, [True] * 11 + [False] * 117)
    assert flat["accuracy_change_ci95"][0] < 0 < flat["accuracy_change_ci95"][1] and not flat["change_excludes_zero"]
    line = held_out_line({"eval_size": 128, **flat})
    assert "95% CI [" in line and "includes zero" in line and "7.8% -> 8.6%" in line
    better = held_out_summary(before, [True] * 60 + [False] * 68)
    assert better["change_excludes_zero"] and "excludes zero" in held_out_line({"eval_size": 128, **better})
    assert better["accuracy_after_ci95"][0] < 60 / 128 < better["accuracy_after_ci95"][1]
    assert held_out_summary(None, None)["accuracy_change"] is None
    assert "not measured" in held_out_line({"eval_size": 0, **held_out_summary(None, None)})


def test_report_picture_draws_with_intervals_and_unseen(tmp_path):
    from prioreplay.apps.report_figure import render

    steps = [
        {
            "step": i,
            "heap": 40,
            "solved": 10,
            "unsolved": 14 - i,
            "leased": i,
            "unseen": 30 - 10 * i,
            "priority_histogram": [0] * 19 + [40],
            "priority_bucket_edges": [0.0125 * k for k in range(21)],
            "effective_group_fraction_window": 0.4,
            "mean_reward_window": 0.2,
        }
        for i in range(1, 4)
    ]
    report = {
        "name": "t",
        "config": {"sampler": "heap"},
        "steps": steps,
        "eval_size": 128,
        **held_out_summary([True] * 10 + [False] * 118, [True] * 12 + [False] * 116),
    }
    assert render(report, tmp_path / "r.png").stat().st_size > 10_000


def test_served_priority_histogram_is_read_per_bucket():
    text = (
        "# HELP prioreplay_sampled_priority p\n# TYPE prioreplay_sampled_priority histogram\n"
        'prioreplay_sampled_priority_bucket{le="0.1"} 2.0\nprioreplay_sampled_priority_bucket{le="0.25"} 7.0\n'
        'prioreplay_sampled_priority_bucket{le="+Inf"} 7.0\nprioreplay_sampled_priority_count 7.0\n'
        "prioreplay_sampled_priority_sum 1.0\n"
    )
    assert scrape_histogram(text, "prioreplay_sampled_priority") == {"le": [0.1, 0.25, float("inf")], "count": [2.0, 5.0, 0.0]}


def test_the_summary_warns_when_rewards_failed_and_is_silent_otherwise():
    from prioreplay.apps.demo_report import scoring_failures_line

    clean = {"worker_metrics": {"worker-0": {"prioreplay_worker_reward_errors_total": 0.0}}}
    assert scoring_failures_line(clean) is None and scoring_failures_line({}) is None
    failed = {
        "worker_metrics": {
            "worker-0": {"prioreplay_worker_reward_errors_total": 30.0, "prioreplay_worker_verifier_errors_total": 1.0},
            "worker-1": {"prioreplay_worker_reward_errors_total": 2.0},
        }
    }
    line = scoring_failures_line(failed)
    assert line is not None and "32 reward plugin call(s), 1 verifier call(s)" in line and "logs/worker-*.log" in line
