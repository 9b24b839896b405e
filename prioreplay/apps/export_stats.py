"""``prioreplay export-stats``: a finished run's per-problem statistics as a warm-start file.

Reads the memory store's snapshot of a run (a demo run directory's ``server-snapshot.json``, or a
server's ``--snapshot-path``) and writes every reported problem's decayed reward sums in the
format a new server's ``--warm-start`` reads (:mod:`prioreplay.warm_start`), which shrinks them by
``--warm-start-shrink`` toward the prior. Usage::

    prioreplay export-stats --snapshot runs/heap-seed0/server-snapshot.json --out warm.json
    prioreplay demo --seed 1 --warm-start warm.json --warm-start-shrink 0.5
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from prioreplay.config import PrioreplaySettings


class ExportStatsConfig(PrioreplaySettings):
    """Write a run's per-problem statistics as a warm-start file (``--warm-start`` of a new run)."""

    snapshot: Path = Field(description="the run's memory-store snapshot (a demo run's server-snapshot.json)")
    out: Path = Field(description="the warm-start file to write (JSON)")


def run(cfg: ExportStatsConfig) -> int:
    """Export; returns 0. Raises InvalidArgument for a file that is not a snapshot."""
    from prioreplay import warm_start

    stats = warm_start.export_snapshot(cfg.snapshot)
    warm_start.write(cfg.out, stats)
    print(f"{len(stats)} problems' statistics -> {cfg.out}")
    return 0
