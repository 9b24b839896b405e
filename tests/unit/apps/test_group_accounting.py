"""Where every generated group of a demo run went (``demo_report.group_accounting``): the server's
last statistics and the learner's log, charged to one fate each."""

from __future__ import annotations

import json
from types import SimpleNamespace

from prioreplay.apps.demo_report import group_accounting, groups_line, learner_totals


def _final(**kw):
    base = dict(groups_mixed=30, groups_all_correct=6, groups_all_wrong=4, groups_constant=0)
    base.update(groups_acked=24, queue_depth=3, pending_groups=3)
    return SimpleNamespace(**{**base, **kw})


def _log(path, *lines):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + "not json\n")
    return path


def test_every_group_is_charged_to_one_fate(tmp_path):
    log = _log(
        tmp_path / "learner.jsonl",
        {"step": 1, "groups_total": {"used": 4, "stale": 0}},
        {"step": 5, "groups_total": {"used": 20, "stale": 2, "zero_variance": 1, "invalid": 0, "skipped": 1}},
        {"end": True, "groups_total": {"used": 20, "stale": 2, "zero_variance": 1, "invalid": 1, "skipped": 0}},
    )
    g = group_accounting(_final(), log)
    assert (g["generated"], g["queued"], g["filtered_at_server"]) == (40, 30, 10)
    assert (g["trained"], g["dropped_stale"], g["dropped_other"], g["left_untrained"]) == (20, 2, 2, 6)
    assert g["unaccounted"] == 0 and g["trained_share"] == 20 / 30  # the end line wins over the step lines
    line = groups_line({"groups": g})
    assert "40 generated, 10 filtered at the server, 30 queued" in line and "20 trained (67%)" in line
    assert "6 left untrained at the end" in line


def test_a_learner_without_fates_in_its_log_leaves_the_learners_figures_empty(tmp_path):
    log = _log(tmp_path / "learner.jsonl", {"step": 1, "groups_used": 4})
    g = group_accounting(_final(), log)
    assert g["queued"] == 30 and g["trained"] is None and g["trained_share"] is None
    assert "does not count fates" in groups_line({"groups": g})
    assert learner_totals(tmp_path / "missing.jsonl") is None
    assert "not counted" in groups_line({})


def test_a_restarted_learner_shows_as_unaccounted_and_nothing_queued_has_no_share(tmp_path):
    log = _log(tmp_path / "learner.jsonl", {"end": True, "groups_total": {"used": 10}})  # the second process only
    g = group_accounting(_final(), log)
    assert g["unaccounted"] == 30 - 10 - 6
    empty = group_accounting(_final(groups_acked=0, queue_depth=0, pending_groups=0, groups_mixed=0), log)
    assert empty["queued"] == 0 and empty["trained_share"] is None
