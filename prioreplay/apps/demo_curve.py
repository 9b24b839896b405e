"""The held-out learning curve of a demo run (``--eval-points N``).

While the run goes, the demo watches its budget (completions, or completion tokens with a token
budget); each time it passes one of N evenly spaced marks (k/(N + 1) of the budget, k = 1..N) it
keeps the newest published policy version: hard links to its files under ``RUN_DIR/curve/v-<N>``
(no copy; the learner may delete its own directory meanwhile). After the run every kept version
is scored on the held-out slice, greedily, like the before and after scores, and its links are
deleted. The report's ``heldout_curve`` is then N + 2 points: before training (0 rollouts), the
N kept versions, and the final policy (``prioreplay/curves.py`` reads rollouts to target off it).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("prioreplay.apps.demo_curve")


@dataclass
class CurveKeeper:
    """Keeps the published versions at N marks of the budget (see the module docstring).

    Attributes:
        run_dir: the run directory (versions are read from ``checkpoints/published``).
        budget: the budget the marks divide (completions, or completion tokens), > 0.
        points: N, kept versions at most.
        kept: (rollouts, completion tokens, version, directory) per kept version, in order.
    """

    run_dir: Path
    budget: float
    points: int
    kept: list[tuple[int, int, int, Path]] = field(default_factory=list)

    def marks(self) -> list[float]:
        """The budget levels at which a version is kept, ascending."""
        return [self.budget * k / (self.points + 1) for k in range(1, self.points + 1)]

    def observe(self, spent: float, rollouts: int, tokens: int) -> None:
        """The run has spent ``spent`` of its budget (``rollouts`` completions, ``tokens`` completion
        tokens): keep the newest published version once for each mark passed since the last call."""
        due = sum(1 for m in self.marks() if spent >= m)
        while len(self.kept) < due:
            kept = self._keep_newest(rollouts, tokens)
            if kept is None:  # nothing published yet (or it vanished): try again next time
                return

    def _keep_newest(self, rollouts: int, tokens: int) -> tuple[int, int, int, Path] | None:
        published = self.run_dir / "checkpoints" / "published"
        versions = sorted(
            (int(p.name[2:]), p) for p in published.glob("v-*") if p.name[2:].isdigit() and (p / "prioreplay.json").exists()
        )
        if not versions:
            return None
        version, src = versions[-1]
        dst = self.run_dir / "curve" / f"mark-{len(self.kept) + 1}-v-{version}"  # one per mark, never reused
        shutil.rmtree(dst, ignore_errors=True)  # a failed attempt's leftovers
        try:
            dst.mkdir(parents=True)
            for f in src.iterdir():
                os.link(f, dst / f.name)
        except OSError as e:  # pruned while linking: try again at the next call
            log.info("could not keep published version %s for the curve (%s)", src, e)
            shutil.rmtree(dst, ignore_errors=True)
            return None
        self.kept.append((rollouts, tokens, version, dst))
        return self.kept[-1]

    def score(self, evaluate: Callable[[Path], list[bool] | None]) -> list[dict[str, Any]]:
        """Score every kept version with ``evaluate(weights_dir)`` (per-problem correctness), then
        delete its links. Returns one point per version: rollouts, completion tokens, version,
        accuracy (None without a held-out slice)."""
        out = []
        for rollouts, tokens, version, path in self.kept:
            right = evaluate(path)
            out.append(
                {
                    "rollouts": rollouts,
                    "completion_tokens": tokens,
                    "policy_version": version,
                    "accuracy": sum(right) / len(right) if right else None,
                }
            )
            shutil.rmtree(path, ignore_errors=True)
        return out


def curve_points(
    before: list[bool] | None, kept: list[dict[str, Any]], after: list[bool] | None, rollouts: int, tokens: int
) -> list[dict[str, Any]]:
    """The report's ``heldout_curve``: before training, the kept versions, the final policy."""
    acc = lambda right: sum(right) / len(right) if right else None  # noqa: E731
    start = {"rollouts": 0, "completion_tokens": 0, "policy_version": 0, "accuracy": acc(before)}
    end = {"rollouts": rollouts, "completion_tokens": tokens, "policy_version": None, "accuracy": acc(after)}
    return [start, *kept, end]
