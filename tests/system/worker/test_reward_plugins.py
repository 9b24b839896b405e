"""`prioreplay worker --reward ...` as a process: it refuses to start on a plugin it cannot import,
and with the example plugins plus one that raises it reports every group (the bad plugin scores
0, is logged with the problem id, and never stops the worker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.convert import problem_to_proto
from prioreplay.priority_server.store import StoreConfig
from prioreplay.problems import ProblemRecord
from prioreplay.tiny_model import make_tiny_model
from tests.conftest import start_background_server

REPO = Path(__file__).resolve().parents[3]
B, G = 2, 2
PROBLEMS = [ProblemRecord(id=f"p{i}", prompt=f"Compute {i} + {i}.", answer=str(2 * i), verifier="gsm8k") for i in range(4)]


def worker(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "prioreplay.apps.cli", "worker", "--metrics-port", "0", "--log-level", "WARNING", *args]
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_a_worker_refuses_to_start_when_a_plugin_cannot_be_imported(tmp_path):
    r = worker("--reward", "my_missing_pkg.rewards:score", "--server", "127.0.0.1:1", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "reward plugin 'my_missing_pkg.rewards:score' cannot be imported" in r.stderr
    assert "No module named 'my_missing_pkg'" in r.stderr and "install its package" in r.stderr


@pytest.mark.slow
def test_a_worker_scores_with_the_example_plugins_and_survives_a_raising_one(tmp_path, redis_url, namespace):
    (tmp_path / "bad.py").write_text("def score(c, r, m):\n    raise ValueError('broken plugin')\n", encoding="utf-8")
    model = make_tiny_model(tmp_path / "model", seed=0)
    server = start_background_server("memory", redis_url, namespace, store_config=StoreConfig(seed=1))
    client = PriorityClient(ClientSettings(server=server.address), max_retries=2, backoff_s=0.05)
    try:
        client.register(problem_to_proto(p) for p in PROBLEMS)
        outcomes = tmp_path / "outcomes.jsonl"
        r = worker(
            *("--server", server.address, "--model", str(model), "--device", "cpu", "--max-new-tokens", "4"),
            *("--group-size", str(G), "--batch-size", str(B), "--max-batches", "2", "--outcomes-file", str(outcomes)),
            *("--reward", f"{REPO / 'examples' / 'rewards.py'}:answer_format", "--reward", "bad.py:score"),
            *("--reward-weights", "1,3"),
            cwd=tmp_path,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        lines = [json.loads(line) for line in outcomes.read_text(encoding="utf-8").splitlines()]
        assert len(lines) == 2 * B and all(len(x["rewards"]) == G for x in lines)
        assert all(0.0 <= x <= 0.25 for line in lines for x in line["rewards"])  # bad.py scores 0 at weight 3 of 4
        assert all(line["passed"] == [False] * G for line in lines)  # a failed reward never passes
        assert "reward bad.py:score failed on 2 of 2 completions (error, scored 0): ValueError: broken plugin" in r.stderr
        assert f"problem {lines[0]['problem_id']}: reward bad.py:score" in r.stderr
        assert client.stats().completions_reported == 2 * B * G
    finally:
        client.close()
        server.stop()
