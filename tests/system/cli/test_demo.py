"""Smoke test of ``prioreplay demo``: the real program, every knob turned down.

Reductions (each keeps the code path, only shrinks the work):
- a tiny random Llama built in the test instead of SmolLM2 (no download, seconds to train);
- 48 arithmetic problems instead of 512, 4 held-out problems instead of 32;
- 3 learner steps of 2 groups (no rollout budget: the steps end the run), leases of 4 problems, 8 new
  tokens per completion.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prioreplay.tiny_model import make_tiny_model

# each test runs the whole demo (or its processes): minutes; make test-fast leaves them out
pytestmark = pytest.mark.slow


def _run_demo(tmp_path, *extra: str) -> dict:
    model = make_tiny_model(tmp_path / "tiny", seed=0)
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "prioreplay.apps.cli",
        "demo",
        "--model",
        str(model),
        "--dataset",
        "arithmetic:48",
        "--steps",
        "3",
        "--eval-size",
        "4",
        "--batch-groups",
        "2",
        "--batch-size",
        "4",
        "--group-size",
        "4",
        "--max-new-tokens",
        "8",
        "--rollouts",
        "0",
        "--run-dir",
        str(run_dir),
        "--timeout-s",
        "400",
        *extra,
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, f"demo failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert (run_dir / "report.png").stat().st_size > 10_000
    # every long phase shows its progress, and the run says what it keeps on disk (issue 43)
    assert "held-out, before:" in proc.stderr and "held-out, after:" in proc.stderr
    assert f"disk: {run_dir} holds" in proc.stderr
    return json.loads((run_dir / "report.json").read_text())


def _check_report(report: dict) -> None:
    final = report["final"]
    # the server leased problems and received groups
    assert final["step"] >= 1 and final["completions_reported"] >= 4 * 4
    assert final["heap"] + final["solved"] + final["unsolved"] + final["leased"] == final["problems"] == 48
    # the learner published at least two versions, one per step
    assert final["policy_version"] >= 2
    assert [s["step"] for s in report["steps"]] == [1, 2, 3]
    assert report["final_checkpoint"].endswith("step-3")
    # the run keeps what it reports on: the final checkpoint and the newest published version
    ckpts = Path(report["final_checkpoint"]).parent
    assert sorted(p.name for p in ckpts.glob("step-*")) == ["step-3"]
    assert sorted(p.name for p in (ckpts / "published").iterdir()) == [f"v-{report['final']['policy_version']}"]
    # what the run keeps is in the report: the checkpoint a resume needs and the final weights
    disk = report["disk"]
    assert disk["trainer_state_kept"] and disk["checkpoints"] == ["step-3"] and disk["checkpoint_bytes"] > 0
    assert disk["run_dir_bytes"] >= disk["checkpoint_bytes"] + disk["published_bytes"] > disk["checkpoint_bytes"]
    # the worker loaded a newer version than the one it started with
    worker = report["worker_metrics"]["worker-0"]
    assert worker["prioreplay_worker_policy_version"] >= 1
    assert worker["prioreplay_worker_weight_reload_seconds_count"] >= 1
    # the report holds what the picture is drawn from
    for key in ("config", "steps", "accuracy_before", "accuracy_after", "forgetting_events", "eval_size"):
        assert key in report
    assert report["eval_size"] == 4 and 0.0 <= report["accuracy_after"] <= 1.0
    assert len(report["steps"][0]["priority_histogram"]) + 1 == len(report["steps"][0]["priority_bucket_edges"])
    # every accepted group is in the run's outcome history, with the run's sampler and seed
    run_dir = Path(report["final_checkpoint"]).parents[1]
    rows = [json.loads(x) for x in (run_dir / "outcomes.jsonl").read_text().splitlines()]
    assert report["outcomes"] == {"file": "outcomes.jsonl", "groups": len(rows)}
    assert sum(len(r["rewards"]) for r in rows) == final["completions_reported"]
    assert {r["sampler"] for r in rows} == {report["config"]["sampler"]} and {r["seed"] for r in rows} == {0}
    assert all(set(r["rewards"]) <= {0.0, 1.0} and 0 <= r["policy_version"] <= final["policy_version"] for r in rows)
    assert max(r["policy_version"] for r in rows) >= 1  # groups of a trained version are there too
    # every generated group is trained or charged (the demo runs with --pace-batches 1: none goes stale)
    g = report["groups"]
    assert g["generated"] == len(rows) and g["queued"] + g["filtered_at_server"] == g["generated"]
    assert g["trained"] == sum(s["learner"]["groups_used"] for s in report["steps"]) >= 3
    assert (g["dropped_stale"], g["unaccounted"]) == (0, 0)
    assert g["trained"] + g["dropped_other"] + g["left_untrained"] == g["queued"]
    assert g["trained_share"] == g["trained"] / g["queued"]
    # every child exited cleanly
    assert set(report["children_exit_codes"]) == {"server", "learner", "worker-0"}
    assert all(code == 0 for code in report["children_exit_codes"].values())


@pytest.mark.timeout(600)
def test_demo_memory_store(tmp_path):
    _check_report(_run_demo(tmp_path))


@pytest.mark.timeout(600)
def test_demo_redis_store(tmp_path, redis_url):
    import redis

    report = _run_demo(tmp_path, "--redis-url", redis_url, "--sampler", "uniform")
    try:
        _check_report(report)
        assert report["config"]["sampler"] == "uniform"
    finally:
        r = redis.Redis.from_url(redis_url)
        keys = list(r.scan_iter(match=f"*{{{report['namespace']}}}*"))
        assert keys, "the demo's state should have been in Redis under its run namespace"
        r.delete(*keys)


@pytest.mark.timeout(600)
def test_demo_with_reward_plugins_from_a_file_and_the_examples(tmp_path):
    """``--reward`` reaches every worker: a parity plugin (the tiny model never answers right, so it
    makes the mixed groups the learner needs) plus the example format reward, weighted."""
    (tmp_path / "parity.py").write_text("def score(c, r, m):\n    return float(len(c) % 2 == 0)\n", encoding="utf-8")
    example = Path(__file__).resolve().parents[3] / "examples" / "rewards.py"
    report = _run_demo(tmp_path, "--reward", "parity.py:score", "--reward", f"{example}:answer_format", "--reward-weights", "3,1")
    assert [s["step"] for s in report["steps"]] == [1, 2, 3]  # the learner trained on the plugins' mixed groups
    assert report["config"]["reward"] == ["parity.py:score", f"{example}:answer_format"]
    outcomes = [json.loads(line) for f in (tmp_path / "run").glob("outcomes*.jsonl") for line in f.read_text().splitlines()]
    assert outcomes and all(len(o["passed"]) == len(o["rewards"]) for o in outcomes)
    assert {r for o in outcomes for r in o["rewards"]} <= {0.0, 0.25, 0.75, 0.875, 1.0}  # (3 parity + format) / 4


def test_a_crashed_child_stops_the_run_with_its_log_tail(tmp_path):
    import time

    from prioreplay.apps.demo_children import ChildFailed, Children

    (tmp_path / "logs").mkdir()
    children = Children(tmp_path)
    alive = children.spawn("server", ["server", "--port", "0", "--metrics-port", "0"], 0, threads=1)
    broken = children.spawn("worker-0", ["no-such-command"], 0, threads=1)
    try:
        deadline = time.time() + 60
        while "listening on" not in alive.log_path.read_text() and time.time() < deadline:
            time.sleep(0.1)  # a child stopped before it installs its signal handler would just die
        broken.proc.wait(60)
        with pytest.raises(ChildFailed, match=r"worker-0 exited with code 2(.|\n)*unknown command 'no-such-command'"):
            children.check()
    finally:
        t0 = time.time()
        children.stop_all()
    assert alive.proc.returncode == 0 and time.time() - t0 < 30  # the healthy child was stopped cleanly
