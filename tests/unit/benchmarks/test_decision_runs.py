"""The decision plan's runs kept across sessions (benchmarks/decision_runs.py): what counts as
finished, which seeds are complete, which command runs next, and what ``collect`` keeps."""

from __future__ import annotations

import json

import pytest

from benchmarks import decision_runs as dr


def _run(root, arm, seed, report=True):
    d = root / f"{arm}-seed{seed}"
    d.mkdir(parents=True)
    if report:
        (d / "report.json").write_text(json.dumps({"config": {"sampler": arm, "seed": seed}}))
    return d


def test_a_seed_counts_only_when_its_five_arms_are_finished(tmp_path):
    for arm in dr.ARMS:
        _run(tmp_path, arm, 0)
    for arm in dr.ARMS[:4]:
        _run(tmp_path, arm, 1)
    _run(tmp_path, "heap-prior", 1, report=False)  # interrupted: no report
    _run(tmp_path, "uniform", 2)  # not an arm of the plan
    done = dr.finished(tmp_path)
    assert (1, "heap-prior") not in done and (2, "uniform") not in done
    assert dr.complete_seeds(done) == [0]


def test_the_next_command_runs_only_the_missing_arms_of_the_first_incomplete_seed(tmp_path):
    done = {(0, a) for a in dr.ARMS} | {(1, "grpo"), (1, "heap")}
    cmd = dr.next_command(done)
    assert cmd is not None and cmd.startswith(dr.PLAN)
    assert "--samplers dapo,heap-grpo,heap-prior --seed 1 --seeds 1" in cmd and "--run-dir runs/decision/seed1" in cmd
    assert dr.next_command({(s, a) for s in dr.SEEDS for a in dr.ARMS}) is None


def test_collect_keeps_finished_runs_and_leaves_out_the_rest(tmp_path):
    runs, kept = tmp_path / "runs", tmp_path / "kept"
    _run(runs, "grpo", 3)
    _run(runs, "dapo", 3, report=False)
    copies = dr.collect(runs, kept)
    assert [p.parent.name for p in copies] == ["grpo-seed3"]
    assert json.loads(copies[0].read_text())["config"]["seed"] == 3
    with pytest.raises(FileNotFoundError, match="no such run directory"):
        dr.collect(tmp_path / "absent", kept)


def test_the_kept_reports_are_not_ignored_by_git():
    """The kept reports are committed: a .gitignore pattern that swallows benchmarks/runs/ would
    lose every finished run at the next checkout (a bare ``runs/`` did)."""
    import shutil
    import subprocess

    from benchmarks import decision_runs

    git = shutil.which("git")
    root = decision_runs.KEPT.parents[2]
    if git is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    probe = decision_runs.KEPT / "grpo-seed0" / "report.json"
    ignored = subprocess.run([git, "-C", str(root), "check-ignore", "-q", str(probe)], check=False)
    assert ignored.returncode == 1, f"{probe.relative_to(root)} is ignored by git; fix .gitignore"
