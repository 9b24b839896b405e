"""The run report of ``prioreplay demo``: what ``report.json`` holds beyond the steps (token
totals, held-out accuracy with its intervals, the server's served-priority histogram), the
run's per-group outcome history ``outcomes.jsonl``, and the summary lines printed at the end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: The workers' token counters a run report sums (docs/METHOD.md, "How the figures are measured").
TOKEN_METRICS = {
    "completion_tokens": "prioreplay_worker_tokens_generated_total",
    "prompt_tokens": "prioreplay_worker_prompt_tokens_total",
    "useful_tokens": "prioreplay_worker_useful_tokens_total",
}


def token_totals(worker_metrics: dict[str, dict[str, float]]) -> dict[str, int]:
    """Completion, prompt and useful (mixed-group completion) tokens summed over the workers'
    latest /metrics scrapes (``{worker name: {metric: value}}``)."""
    return {key: int(sum(m.get(name, 0.0) for m in worker_metrics.values())) for key, name in TOKEN_METRICS.items()}


def scrape_histogram(text: str, name: str) -> dict[str, list[float]]:
    """One unlabelled histogram of a /metrics text: ``{"le": upper edges, "count": per bucket}``
    (per bucket, not cumulative; the +Inf bucket last). Empty lists when it is absent."""
    from prometheus_client.parser import text_string_to_metric_families

    les, cum = [], []
    for fam in text_string_to_metric_families(text):
        if fam.name != name:
            continue
        for s in fam.samples:
            if s.name == name + "_bucket":
                les.append(float(s.labels["le"]))
                cum.append(s.value)
    order = sorted(range(len(les)), key=les.__getitem__)
    les, cum = [les[i] for i in order], [cum[i] for i in order]
    return {"le": les, "count": [c - (cum[i - 1] if i else 0.0) for i, c in enumerate(cum)]}


def scrape_served(text: str) -> dict[str, Any]:
    """What a report keeps of the server's last /metrics: the served-priority histogram
    (:func:`scrape_histogram`) and, under ``by_task``, the problems served and their priority sum
    per task (:func:`prioreplay.apps.task_report.scrape_served_by_task`)."""
    from prioreplay.apps.task_report import scrape_served_by_task

    return {**scrape_histogram(text, "prioreplay_sampled_priority"), "by_task": scrape_served_by_task(text)}


def held_out_summary(before: list[bool] | None, after: list[bool] | None) -> dict[str, Any]:
    """Held-out accuracy before/after with 95% intervals: Wilson for each accuracy, Newcombe's
    paired interval (1998, method 10) for the change, since the same problems are scored twice.

    Returns a dict: ``accuracy_before``/``accuracy_after`` (or None), their ``*_ci95``,
    ``accuracy_change``, ``accuracy_change_ci95`` and ``change_excludes_zero`` (None without
    held-out problems)."""
    from prioreplay.intervals import paired_difference, wilson

    if not before or not after:
        return {
            "accuracy_before": None,
            "accuracy_after": None,
            "accuracy_change": None,
            "accuracy_change_ci95": None,
            "change_excludes_zero": None,
        }
    n = len(before)
    diff, lo, hi = paired_difference(before, after)
    return {
        "accuracy_before": sum(before) / n,
        "accuracy_before_ci95": list(wilson(sum(before), n)),
        "accuracy_after": sum(after) / n,
        "accuracy_after_ci95": list(wilson(sum(after), n)),
        "accuracy_change": diff,
        "accuracy_change_ci95": [lo, hi],
        "change_excludes_zero": lo > 0 or hi < 0,
        "eval_correct_before": [bool(x) for x in before],
        "eval_correct_after": [bool(x) for x in after],
    }


#: The run directory's per-group outcome history (:func:`collect_outcomes`), and the prefix of the
#: per-worker files it is gathered from.
OUTCOMES_FILE = "outcomes.jsonl"
OUTCOMES_PART = "outcomes-worker-"


def collect_outcomes(run_dir: Path, sampler: str, seed: int) -> int:
    """Gather the workers' ``--outcomes-file`` lines into ``RUN_DIR/outcomes.jsonl``, ordered by
    report time, each with the run's ``sampler`` and ``seed`` added; the per-worker files are removed.

    One line per group of an accepted report: ``problem_id``, ``task``, ``policy_version`` (the learner
    step whose weights generated it), ``rewards`` (G floats), ``lease_id``, ``worker_id``,
    ``time_unix_s``, ``sampler``, ``seed``. Groups of leases that expired unreported are absent.
    It is what ``benchmarks/calibrate.py`` fits the simulator to.

    Returns:
        The number of groups written (0 and no file when no worker recorded one).
    """
    parts = sorted(run_dir.glob(f"{OUTCOMES_PART}*.jsonl"))
    rows = [json.loads(line) for p in parts for line in p.read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: (r["time_unix_s"], r["worker_id"]))
    if rows:
        text = "".join(json.dumps({**r, "sampler": sampler, "seed": seed}) + "\n" for r in rows)
        (run_dir / OUTCOMES_FILE).write_text(text)
    for p in parts:
        p.unlink()
    return len(rows)


def learner_totals(log_path: Path) -> dict[str, int] | None:
    """The learner's groups by fate (``groups_total``) from its log: the run's ``end`` line, else
    the last step line that carries them; None when no line does (a learner from before them)."""
    if not log_path.is_file():
        return None
    totals = None
    for line in log_path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("groups_total"), dict):
            totals = rec["groups_total"]
    return totals


def group_accounting(final, learner_log: Path) -> dict[str, Any]:
    """Where every generated group went (docs/METHOD.md, "Every generated group, trained or charged").

    Args:
        final: the server's ``GetStatsResponse`` once the learner and the workers have stopped.
        learner_log: the learner's ``learner.jsonl`` (its ``groups_total`` by fate, :func:`learner_totals`).

    Returns:
        ``generated`` (reported, every kind), ``queued`` for the learner (acknowledged + delivered
        and unacknowledged + never delivered, at the end), ``filtered_at_server`` (generated −
        queued: zero-variance groups the server counted and did not queue), ``trained`` (in an
        applied optimizer step), ``dropped_stale``, ``dropped_other`` (zero variance at the learner,
        malformed, in a skipped step), ``left_untrained`` (queued or delivered, never trained when
        the run stopped: never delivered + delivered and unacknowledged), ``unaccounted`` (queued −
        the four fates: 0 unless a learner restarted, which counts anew, or groups were delivered
        twice) and ``trained_share`` = trained / queued (None with nothing queued). The learner's
        figures are None when its log has no ``groups_total``.
    """
    generated = final.groups_mixed + final.groups_all_correct + final.groups_all_wrong + final.groups_constant
    left = final.queue_depth + final.pending_groups
    queued = final.groups_acked + left
    out: dict[str, Any] = {
        "generated": generated,
        "queued": queued,
        "filtered_at_server": generated - queued,
        "left_untrained": left,
        "trained": None,
        "dropped_stale": None,
        "dropped_other": None,
        "unaccounted": None,
        "trained_share": None,
    }
    totals = learner_totals(learner_log)
    if totals is not None:
        trained, stale = totals.get("used", 0), totals.get("stale", 0)
        other = sum(totals.get(k, 0) for k in ("zero_variance", "invalid", "skipped"))
        out.update(trained=trained, dropped_stale=stale, dropped_other=other)
        out.update(unaccounted=queued - trained - stale - other - left, trained_share=trained / queued if queued else None)
    return out


def groups_line(report: dict[str, Any]) -> str:
    """The summary line of where the run's groups went (:func:`group_accounting`)."""
    g = report.get("groups")
    if not g:
        return "groups: not counted (a run from before the counting)"
    if g["trained"] is None:
        return f"groups: {g['generated']} generated, {g['queued']} queued for the learner (its log does not count fates)"
    share = "n/a" if g["trained_share"] is None else f"{g['trained_share']:.0%}"
    return (
        f"groups: {g['generated']} generated, {g['filtered_at_server']} filtered at the server, {g['queued']} queued for the "
        f"learner: {g['trained']} trained ({share}), {g['dropped_stale']} stale, {g['dropped_other']} dropped otherwise, "
        f"{g['left_untrained']} left untrained at the end"
    )


def write_report(run_dir: Path, report: dict[str, Any], final) -> None:
    """Write report.json and report.png; print where they are and the headline figures.

    Adds ``by_task`` (:func:`prioreplay.apps.task_report.task_breakdown` of the run's
    ``outcomes.jsonl`` and the served figures of ``report["served_priority"]["by_task"]``) and
    ``groups`` (:func:`group_accounting` of ``final``, the server's last statistics, and the
    run's ``learner.jsonl``)."""
    from prioreplay.apps.pool_audit import audit_line
    from prioreplay.apps.report_figure import render
    from prioreplay.apps.task_report import by_task_lines, task_breakdown

    outcomes = run_dir / OUTCOMES_FILE
    rows = [json.loads(line) for line in outcomes.read_text().splitlines() if line.strip()] if outcomes.is_file() else []
    report["by_task"] = task_breakdown(rows, (report.get("served_priority") or {}).get("by_task"))
    report["groups"] = group_accounting(final, run_dir / "learner.jsonl")
    (run_dir / "report.json").write_text(json.dumps(report, indent=1))
    render(report, run_dir / "report.png")
    print(f"\nrun report: {run_dir / 'report.json'}\npicture:    {run_dir / 'report.png'}")
    print(held_out_line(report))
    print(tokens_line(report))
    print(groups_line(report))
    print(audit_line(report.get("pool_audit")))
    for line in by_task_lines(report["by_task"]):
        print(line)
    if failures := scoring_failures_line(report):
        print(failures)
    print(
        f"effective-group fraction {final.effective_group_fraction:.2f} over {final.completions_reported} rollouts; "
        f"pools heap={final.heap_size} solved={final.solved} unsolved={final.unsolved}; still unseen "
        f"{final.unseen} of {final.problems}; forgetting events {final.forgetting_events}"
    )


def scoring_failures_line(report: dict[str, Any]) -> str | None:
    """A warning line when the workers' rewards failed (a plugin raised, timed out or returned a
    non-reward; a verifier error), each such reward scored 0; None when none did."""
    workers = (report.get("worker_metrics") or {}).values()
    plugin = int(sum(m.get("prioreplay_worker_reward_errors_total", 0.0) for m in workers))
    verifier = int(sum(m.get("prioreplay_worker_verifier_errors_total", 0.0) for m in workers))
    if not plugin and not verifier:
        return None
    return (
        f"WARNING scoring failures, each scored 0: {plugin} reward plugin call(s), {verifier} verifier call(s); "
        "the workers' logs (logs/worker-*.log) name the reward, the problem and the error (docs/REWARDS.md)"
    )


def held_out_line(report: dict[str, Any]) -> str:
    """The summary line of held-out accuracy: never a before/after without the interval of the change."""
    if report.get("accuracy_change") is None:
        return "held-out accuracy: not measured (--eval-size 0)"
    lo, hi = report["accuracy_change_ci95"]
    verdict = (
        "the interval excludes zero" if report["change_excludes_zero"] else "the interval includes zero: no measurable change"
    )
    return (
        f"held-out accuracy ({report['eval_size']} problems, greedy): {_pct(report['accuracy_before'])} -> "
        f"{_pct(report['accuracy_after'])}, change {report['accuracy_change'] * 100:+.1f} points, "
        f"95% CI [{lo * 100:+.1f}, {hi * 100:+.1f}] (Newcombe paired); {verdict}"
    )


def tokens_line(report: dict[str, Any]) -> str:
    """What the run paid: completion, useful and prompt tokens and wall-clock seconds."""
    t = report.get("tokens") or {}
    if not t.get("completion_tokens"):
        return f"tokens: not counted; wall-clock {report.get('duration_s', 0):.0f} s"
    return (
        f"tokens generated: {t['completion_tokens']:,} completion ({t['useful_tokens']:,} useful, in mixed groups: "
        f"{t['useful_tokens'] / t['completion_tokens']:.0%}), {t['prompt_tokens']:,} prompt; "
        f"wall-clock {report.get('duration_s', 0):.0f} s"
    )


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1%}"
