"""The demo's outcome history: the workers' ``--outcomes-file`` lines gathered into one
``outcomes.jsonl`` per run, in report order, each naming the run's sampler and seed."""

from __future__ import annotations

import json

from prioreplay.apps.demo_report import OUTCOMES_FILE, OUTCOMES_PART, collect_outcomes


def _line(pid: str, t: float, worker: str, version: int = 0) -> str:
    return json.dumps(
        {
            "problem_id": pid,
            "policy_version": version,
            "rewards": [1.0, 0.0],
            "lease_id": "l",
            "worker_id": worker,
            "time_unix_s": t,
        }
    )


def test_worker_files_merge_in_report_order_with_sampler_and_seed(tmp_path):
    (tmp_path / f"{OUTCOMES_PART}0.jsonl").write_text(_line("a", 3.0, "worker-0", 1) + "\n" + _line("b", 1.0, "worker-0") + "\n")
    (tmp_path / f"{OUTCOMES_PART}1.jsonl").write_text(_line("c", 2.0, "worker-1") + "\n\n")
    assert collect_outcomes(tmp_path, "heap", 7) == 3
    rows = [json.loads(x) for x in (tmp_path / OUTCOMES_FILE).read_text().splitlines()]
    assert [r["problem_id"] for r in rows] == ["b", "c", "a"]
    assert all(r["sampler"] == "heap" and r["seed"] == 7 for r in rows)
    assert rows[2]["policy_version"] == 1 and rows[0]["rewards"] == [1.0, 0.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [OUTCOMES_FILE]  # the per-worker files are gone


def test_no_worker_lines_write_no_file(tmp_path):
    assert collect_outcomes(tmp_path, "uniform", 0) == 0
    assert not (tmp_path / OUTCOMES_FILE).exists()
