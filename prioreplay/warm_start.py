"""Priority memory across runs: a run's per-problem statistics, exported, and a new run started
from them shrunk toward the prior (verl issue 2584 asks for it; standard library only).

A run of the same dataset on the same base model (another seed, another learning rate) starts
with every problem at the maximum priority, and spends its first epoch finding again what the
previous run knew: which problems the model always or never solves. Exported statistics
(:func:`export_snapshot`: the decayed reward sums n, Σr, Σr² of every problem a run reported)
let a new server start from them (``--warm-start FILE``): a newly registered problem whose id is
in the file starts with ρ·(n, Σr, Σr²) (:func:`shrink`, ``--warm-start-shrink`` ρ in [0, 1]) —
its success-rate estimate unchanged, its weight cut to ρ of the evidence, so it counts as ρ·n
pseudo-observations on top of the Beta prior, which the first groups of the new run outweigh
(ρ = 0: a cold start; ρ = 1: as if the old run went on). Every warm problem starts in the heap at
the priority of its shrunk statistics (``rules.priority``), never in a pool: the new run's policy
is not the old one's, so a pool verdict would be unfounded. A problem registered before, or not
in the file, is unchanged.

The file is JSON: ``{"format": "prioreplay-warm-start", "version": 1, "stats": {id: [n, s1, s2]}}``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from prioreplay.errors import InvalidArgument
from prioreplay.rules import Stats

WARM_FORMAT = "prioreplay-warm-start"
WARM_VERSION = 1
#: Fields of a memory-store snapshot's problem row (``snapshot.encode``): id, then n, s1, s2.
_ID, _N, _S1, _S2 = 0, 5, 6, 7


def export_snapshot(snapshot_path: Path) -> dict[str, tuple[float, float, float]]:
    """The statistics of every problem a run reported (n > 0), from its memory-store snapshot.

    Raises:
        InvalidArgument: the file is missing or not a snapshot (the message names it).
    """
    try:
        rows = json.loads(Path(snapshot_path).read_text())["problems"]
        return {row[_ID]: (float(row[_N]), float(row[_S1]), float(row[_S2])) for row in rows if float(row[_N]) > 0}
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise InvalidArgument(f"{snapshot_path}: not a memory-store snapshot ({e}); export a run of the memory store") from None


def write(path: str | Path, stats: dict[str, tuple[float, float, float]]) -> None:
    """Write a warm-start file (see the module docstring)."""
    doc = {"format": WARM_FORMAT, "version": WARM_VERSION, "stats": {k: list(v) for k, v in sorted(stats.items())}}
    Path(path).write_text(json.dumps(doc))


def read(path: str | Path) -> dict[str, Stats]:
    """The statistics of a warm-start file, by problem id.

    Raises:
        InvalidArgument: the file is missing, of another format, or holds a row that is not
            [n, s1, s2] with 0 <= s2 <= s1 <= n finite (the message names the path and the id).
    """
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise InvalidArgument(f"warm start {path}: unreadable ({e}); write it with `prioreplay export-stats`") from None
    if not isinstance(doc, dict) or doc.get("format") != WARM_FORMAT or not isinstance(doc.get("stats"), dict):
        raise InvalidArgument(f"warm start {path}: not a {WARM_FORMAT} file; write it with `prioreplay export-stats`")
    out = {}
    for pid, row in doc["stats"].items():
        ok = isinstance(row, list) and len(row) == 3 and all(isinstance(x, (int, float)) and math.isfinite(x) for x in row)
        if not ok or not (0 <= row[2] <= row[1] + 1e-9 and row[1] <= row[0] + 1e-9):
            raise InvalidArgument(f"warm start {path}: problem {pid!r} has {row!r}; want [n, s1, s2] with 0 <= s2 <= s1 <= n")
        out[pid] = Stats(float(row[0]), float(row[1]), float(row[2]))
    return out


def shrink(stats: Stats, factor: float) -> Stats:
    """ρ·(n, Σr, Σr²): the evidence cut to ``factor`` ρ of its weight, the estimate kept.

    Raises:
        InvalidArgument: ρ outside [0, 1].
    """
    if not (0.0 <= factor <= 1.0):
        raise InvalidArgument(f"warm start shrink ({factor}) must be in [0, 1] (0: a cold start)")
    return Stats(factor * stats.n, factor * stats.s1, factor * stats.s2)
