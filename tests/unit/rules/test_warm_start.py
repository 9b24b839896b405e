"""Priority memory across runs (prioreplay.warm_start): export from a snapshot, the file, shrinking."""

from __future__ import annotations

import json

import pytest

from prioreplay import warm_start
from prioreplay.errors import InvalidArgument
from prioreplay.rules import Stats


def test_shrinking_keeps_the_estimate_and_cuts_the_weight():
    st = warm_start.shrink(Stats(8.0, 2.0, 2.0), 0.25)
    assert st == Stats(2.0, 0.5, 0.5) and st.s1 / st.n == 0.25
    assert warm_start.shrink(Stats(8.0, 2.0, 2.0), 0.0) == Stats(0.0, 0.0, 0.0)  # a cold start
    with pytest.raises(InvalidArgument, match="shrink"):
        warm_start.shrink(Stats(), 1.5)


def test_the_file_round_trips_and_bad_rows_are_named(tmp_path):
    path = tmp_path / "w.json"
    warm_start.write(path, {"a": (4.0, 1.0, 1.0), "b": (2.0, 0.0, 0.0)})
    assert warm_start.read(path) == {"a": Stats(4.0, 1.0, 1.0), "b": Stats(2.0, 0.0, 0.0)}
    path.write_text(json.dumps({"format": warm_start.WARM_FORMAT, "version": 1, "stats": {"x": [1.0, 2.0, 0.0]}}))
    with pytest.raises(InvalidArgument, match="problem 'x'"):
        warm_start.read(path)
    path.write_text("{}")
    with pytest.raises(InvalidArgument, match="export-stats"):
        warm_start.read(path)


def test_export_takes_every_reported_problem_of_a_snapshot(tmp_path):
    from prioreplay.apps.export_stats import ExportStatsConfig, run
    from prioreplay.priority_server.store import snapshot
    from prioreplay.priority_server.store.snapshot import Entry, MemoryState
    from prioreplay.problems import ProblemRecord
    from prioreplay.rules import Pool

    state = MemoryState()
    for pid, st in (("seen", Stats(4.0, 3.0, 3.0)), ("unseen", Stats())):
        state.problems[pid] = Entry(ProblemRecord(pid, "q", "1"), pid, st, Pool.HEAP, Pool.HEAP, 0.1)
    snap = tmp_path / "snap.json"
    snapshot.write_atomic(snap, snapshot.encode(state))
    assert run(ExportStatsConfig(_cli_parse_args=[], snapshot=snap, out=tmp_path / "w.json")) == 0
    assert warm_start.read(tmp_path / "w.json") == {"seen": Stats(4.0, 3.0, 3.0)}
    with pytest.raises(InvalidArgument, match="not a memory-store snapshot"):
        warm_start.export_snapshot(tmp_path / "missing.json")
