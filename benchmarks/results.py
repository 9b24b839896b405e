"""Where the benchmarks' figures go: :class:`Results` (one invocation's figures, merged into
``benchmarks/results.json`` by name), :func:`merge_results` (a side run's figures written in
place), and the progress log every part writes to.

Shared by ``benchmarks.run`` and the parts that have their own command line
(``benchmarks.overhead``, ``benchmarks.decision``), so none of them imports another's runner.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results.json"
DOCS = REPO / "docs"


def log(msg: str) -> None:
    """One progress line on stderr (stdout is the figures' table)."""
    print(msg, file=sys.stderr, flush=True)


class Results:
    """Figures of one invocation, merged into results.json by name (other figures are kept).

    Args:
        command: the command line that produced the figures (stored with each).
        note: measurement conditions, stored with each figure when given.
        prefix: prepended to every figure name.

    Attributes:
        items: the figures so far, in the order added.
        plot_errors: ``"PATH: error"`` of every plot that failed (:meth:`plot`); the figures are
            kept and written all the same.
    """

    def __init__(self, command: str, note: str = "", prefix: str = ""):
        self.command = command
        self.note = note
        self.prefix = prefix
        self.date = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.cores = os.cpu_count() or 0
        self.items: list[dict[str, Any]] = []
        self.plot_errors: list[str] = []

    def add(self, name: str, value: float | int | None, unit: str, **extra: Any) -> None:
        """Record figure ``name`` (``value`` in ``unit``; ``extra``: its parameters, how it was measured)."""
        item = {
            "name": self.prefix + name,
            "value": value,
            "unit": unit,
            "command": self.command,
            "date": self.date,
            "machine_cores": self.cores,
        }
        if self.note:
            item["note"] = self.note
        item.update(extra)
        self.items.append(item)

    def plot(self, path: str | Path, draw: Callable[[str], None]) -> bool:
        """``draw(path)``; a failure is logged and kept in :attr:`plot_errors`, not raised, so the
        figures measured before it are still written. Returns whether the plot was written."""
        try:
            draw(str(path))
        except Exception as e:  # noqa: BLE001 - a picture must not cost the measured figures
            self.plot_errors.append(f"{path}: {type(e).__name__}: {e}")
            log(f"plot {path} failed ({type(e).__name__}: {e}); the figures are kept")
            return False
        return True

    def write(self, path: Path) -> None:
        """Merge the figures into the results file at ``path`` (sorted by name; others kept)."""
        old = json.loads(path.read_text()) if path.is_file() else []
        names = {i["name"] for i in self.items}
        merged = [i for i in old if i.get("name") not in names] + self.items
        path.write_text(json.dumps(sorted(merged, key=lambda i: i["name"]), indent=1, allow_nan=True) + "\n")


def merge_results(path: Path, items: list[dict[str, Any]]) -> None:
    """Write ``items`` into the results file at ``path``: an entry of the same name is replaced
    where it stands, a new one appended, every other entry kept in its order (so a run changes
    only its own lines of the file)."""
    old = json.loads(path.read_text()) if path.is_file() else []
    by_name = {i["name"]: i for i in items}
    merged = [by_name.pop(i.get("name"), i) for i in old] + list(by_name.values())
    path.write_text(json.dumps(merged, indent=1, allow_nan=True) + "\n")
