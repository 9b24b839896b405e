"""What an operator meets at ``prioreplay demo`` before any training (issue 43, item 8): a malformed
dataset line ends the demo with its ``file:line`` and nothing written, a ``--reward`` naming a
function the file lacks lists those it has. Real commands; each ends before a model loads."""

from __future__ import annotations

import json
import subprocess
import sys


def _demo(tmp_path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "prioreplay.apps.cli", "demo", "--run-dir", str(tmp_path / "run"), *args]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_a_malformed_dataset_line_ends_the_demo_with_file_and_line_before_anything_is_written(tmp_path):
    bad = tmp_path / "problems.jsonl"
    rows = [json.dumps({"id": f"p{i}", "prompt": f"{i}+1", "answer": str(i + 1)}) for i in range(600)]
    rows[536] = '{"id": "p536", "prompt": '  # past the first registration chunk (512): once a gRPC error mid-stream
    bad.write_text("\n".join(rows) + "\n", encoding="utf-8")
    r = _demo(tmp_path, "--dataset", str(bad), "--eval-size", "0")
    assert r.returncode == 2, r.stderr
    assert f"{bad}:537: invalid JSON" in r.stderr
    assert "Traceback" not in r.stderr and "Exception iterating requests" not in r.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()  # no half-written run folder


def test_a_malformed_held_out_file_is_found_before_anything_is_written_too(tmp_path):
    train, held_out = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    train.write_text(json.dumps({"id": "a", "prompt": "1+1", "answer": "2"}) + "\n", encoding="utf-8")
    held_out.write_text(json.dumps({"id": "b", "prompt": "", "answer": "2"}) + "\n", encoding="utf-8")
    r = _demo(tmp_path, "--dataset", str(train), "--eval-dataset", str(held_out), "--eval-size", "1")
    assert r.returncode == 2 and f"{held_out}:1" in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


def test_a_reward_the_file_does_not_define_lists_the_functions_it_does(tmp_path):
    (tmp_path / "mine.py").write_text("def score(c, r, m):\n    return 1.0\n\ndef brevity(c, r, m):\n    return 0.5\n")
    r = _demo(tmp_path, "--reward", "mine.py:scores")
    assert r.returncode == 2, r.stderr
    assert "has no function 'scores'" in r.stderr and "it defines brevity, score" in r.stderr
    assert not (tmp_path / "run").exists()
