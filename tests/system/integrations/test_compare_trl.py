"""``make compare-trl`` on a tiny budget: both arms train, each run keeps its figures and server
stats, and nothing but them stays on disk (no checkpoints, no final weights)."""

from __future__ import annotations

import json

import pytest

from prioreplay.apps import compare_trl
from prioreplay.tiny_model import make_tiny_model

pytestmark = pytest.mark.slow  # TRL's import and two real training runs of the tiny model: tens of seconds


def test_compare_trl_runs_both_arms_keeps_server_stats_and_bounded_disk(tmp_path, capsys):
    model = make_tiny_model(tmp_path / "tiny", seed=0)
    out = tmp_path / "cmp"
    # every knob down: 1 seed, 2 steps of B = 2 problems × G = 2 completions of ≤ 4 tokens, 4 held-out problems
    argv = ["--model", str(model), "--seeds", "1", "--steps", "2", "--problems", "8", "--eval-size", "4"]
    argv += ["--batch", "2", "--group-size", "2", "--max-new-tokens", "4", "--out", str(out)]
    assert compare_trl.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [(r["arm"], r["seed"]) for r in summary["runs"]] == [("trl", 0), ("prioreplay", 0)]
    for r in summary["runs"]:
        assert 0.0 <= r["effective_group_fraction"] <= 1.0 and r["eval_size"] == 4
        assert r["accuracy_before"] is not None and r["accuracy_after"] is not None
    stats = json.loads((out / "prioreplay-seed0" / "server_stats.json").read_text())
    assert int(stats["completions_reported"]) == 2 * 2 * 2  # steps × B × G: the same budget as the trl arm
    assert int(stats["active_leases"]) == 0
    kept = sorted(p.name for p in (out / "prioreplay-seed0").iterdir())
    assert kept == ["held_out.json", "server_stats.json", "trainer_state.json"]  # no checkpoint, no weights
    assert not (out / "trl-seed0" / "server_stats.json").exists()
    assert "prioreplay" in capsys.readouterr().out
