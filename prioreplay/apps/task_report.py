"""The per-task breakdown of a run report: pass rate, group kinds and served priority by task.

A run on a multi-task mix (``mix:``, ``reasoning-gym:``) asks where the budget went and what each
task gave: ``report.json``'s ``by_task`` holds, per task (:func:`prioreplay.problems.problem_task`,
as the worker records it in each outcome line):

* ``groups``, ``completions``, ``pass_rate`` (completions that passed over completions: a line's
  ``passed`` flags where ``--reward`` plugins wrote them, else reward 1) and the
  shares of ``mixed`` / ``all_wrong`` / ``all_correct`` groups over every group of the run;
* ``first_visit``: the same three shares over each problem's first group only (what the base
  policy gave before any training on it), with its ``groups``;
* ``served`` and ``mean_served_priority``: how many problems the server handed out for the task
  and their mean priority when served (the server's ``prioreplay_task_sampled_total`` and
  ``prioreplay_task_sampled_priority_total``).

Task labels are bounded as on ``/metrics`` (:class:`prioreplay.problems.TaskLabels`: the first
16 tasks seen keep their name, the rest are ``other``), so a dataset with thousands of tasks gives
a short table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prioreplay import rules
from prioreplay.problems import DEFAULT_TASK, MAX_TASK_LABELS, TaskLabels

#: The server's per-task counters (:mod:`prioreplay.priority_server.metrics`) a report reads.
SERVED_METRIC = "prioreplay_task_sampled_total"
SERVED_PRIORITY_METRIC = "prioreplay_task_sampled_priority_total"
_KINDS = {rules.GroupKind.MIXED: "mixed", rules.GroupKind.ALL_WRONG: "all_wrong", rules.GroupKind.ALL_CORRECT: "all_correct"}


def scrape_served_by_task(text: str) -> dict[str, dict[str, float]]:
    """``{task: {"served": n, "priority_sum": s}}`` from a server's /metrics text ({} when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = {SERVED_METRIC: "served", SERVED_PRIORITY_METRIC: "priority_sum"}.get(s.name)
            if key is not None:
                row = out.setdefault(s.labels["task"], {"served": 0.0, "priority_sum": 0.0})
                row[key] += s.value
    return out


def _shares(counts: Mapping[str, int], groups: int) -> dict[str, float | None]:
    return {f"{kind}_fraction": (counts.get(kind, 0) / groups if groups else None) for kind in _KINDS.values()}


def task_breakdown(
    rows: Iterable[Mapping[str, Any]],
    served: Mapping[str, Mapping[str, float]] | None = None,
    limit: int = MAX_TASK_LABELS,
) -> dict[str, dict[str, Any]]:
    """The ``by_task`` table (module docstring) of a run's outcome lines, in report-time order.

    Args:
        rows: outcome lines (``problem_id``, ``rewards``, optional ``passed``, optional ``task``: a
            line without one counts under :data:`~prioreplay.problems.DEFAULT_TASK`).
        served: :func:`scrape_served_by_task` of the server's last /metrics (None: no served figures).
        limit: distinct task labels kept; the rest fold into ``other``.

    Returns:
        ``{task: {...}}``, tasks sorted by name; a task only the server saw has no outcome figures.

    Raises:
        InvalidArgument: ``limit`` < 1.
    """
    labels = TaskLabels(limit)
    acc: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for row in rows:
        rewards = list(row["rewards"])
        if not rewards:
            continue
        task = labels.label(str(row.get("task") or DEFAULT_TASK))
        a = acc.setdefault(task, {"groups": 0, "completions": 0, "passed": 0, "kinds": {}, "first": {}, "first_groups": 0})
        kind = _KINDS.get(rules.classify(rewards), "constant")
        a["groups"] += 1
        a["completions"] += len(rewards)
        a["passed"] += sum(1 for ok in row.get("passed") or [r == 1.0 for r in rewards] if ok)
        a["kinds"][kind] = a["kinds"].get(kind, 0) + 1
        if row["problem_id"] not in seen:
            seen.add(row["problem_id"])
            a["first_groups"] += 1
            a["first"][kind] = a["first"].get(kind, 0) + 1
    out: dict[str, dict[str, Any]] = {}
    for task, a in acc.items():
        out[task] = {
            "groups": a["groups"],
            "completions": a["completions"],
            "pass_rate": a["passed"] / a["completions"],
            **_shares(a["kinds"], a["groups"]),
            "first_visit": {"groups": a["first_groups"], **_shares(a["first"], a["first_groups"])},
        }
    for task, s in (served or {}).items():
        row = out.setdefault(labels.label(task), {})
        row["served"] = int(row.get("served", 0) + s["served"])
        row["priority_sum"] = row.get("priority_sum", 0.0) + s["priority_sum"]
    for row in out.values():
        if "served" in row:
            row["mean_served_priority"] = row.pop("priority_sum") / row["served"] if row["served"] else None
    return dict(sorted(out.items()))


def by_task_lines(by_task: Mapping[str, Mapping[str, Any]] | None) -> list[str]:
    """The report's per-task summary lines (none for a run with a single task)."""
    if not by_task or len(by_task) < 2:
        return []
    lines = ["by task: pass rate, first-visit groups wrong/mixed/right, mean served priority"]
    for task, t in by_task.items():
        fv = t.get("first_visit") or {}
        kinds = "/".join(_pct(fv.get(f"{k}_fraction")) for k in ("all_wrong", "mixed", "all_correct"))
        prio = t.get("mean_served_priority")
        lines.append(
            f"  {task:<24} {_pct(t.get('pass_rate')):>5} over {t.get('completions', 0)} completions; "
            f"first visit {kinds} of {fv.get('groups', 0)}; served {t.get('served', 0)}"
            + (f" at mean priority {prio:.3f}" if prio is not None else "")
        )
    return lines


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"
