"""benchmarks/pacing.py on a tiny fleet: a real server, simulated workers and learner (seconds)."""

from __future__ import annotations

import json

from benchmarks import pacing


def test_the_bound_trades_idle_workers_for_no_stale_groups():
    sizes = dict(seconds=2.0, workers=4, worker_batch=2, learner_batch=4, gen_s=0.2)
    free = pacing.run_one(0, 2.0, **sizes)
    paced = pacing.run_one(1, 2.0, **sizes)
    assert free["worker_wait_share"] == 0.0 and free["stale_share"] > 0.0  # the slow learner falls behind
    assert paced["stale_share"] == 0.0 and 0.2 < paced["worker_wait_share"] < 1.0  # workers wait instead
    assert paced["trained_share"] > free["trained_share"]


def test_the_command_records_every_figure_and_draws_the_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(pacing, "PACES", (0, 1))
    monkeypatch.setattr(pacing, "RATIOS", (2.0,))
    out, png = tmp_path / "results.json", tmp_path / "pacing.png"
    out.write_text("[]")
    monkeypatch.setattr(
        pacing, "measure", lambda *a, **k: {f"r2.k{p}": pacing.run_one(p, 2.0, seconds=1.0, workers=2, worker_batch=2,
                                                                        learner_batch=2, gen_s=0.1) for p in (0, 1)}
    )  # fmt: skip
    assert pacing.main(["--rounds", "2", "--out", str(out), "--plot", str(png)]) == 0
    names = {r["name"] for r in json.loads(out.read_text())}
    assert {f"pacing.r2.k{p}.{k}" for p in (0, 1) for k in ("worker_wait_share", "stale_share", "trained_share")} <= names
    assert png.stat().st_size > 0
