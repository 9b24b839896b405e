"""The pull-latency benchmark (``service.pull_latency.*`` in benchmarks/RESULTS.md) runs both modes and counts
every report (no timing asserted)."""

from __future__ import annotations

from benchmarks.pull_latency import PullLatencyParams, run_pull_latency


async def test_pull_latency_measures_polled_and_woken_side_by_side(redis_url):
    out = await run_pull_latency(PullLatencyParams(reports=4, gap_s=(0.001, 0.002), stores=("memory", "redis")), redis_url)
    rows = {(r["store"], r["mode"]): r for r in out["rows"]}
    assert set(rows) == {(s, m) for s in ("memory", "redis") for m in ("polled", "woken")}
    assert all(r["reports"] == 4 and 0 <= r["p50_ms"] <= r["p99_ms"] for r in rows.values())
