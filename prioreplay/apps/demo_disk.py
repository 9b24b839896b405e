"""What a finished demo run keeps on disk, and how much it is.

A run's learner writes ``checkpoints/step-N/`` (the weights and ``trainer_state.pt``: the AdamW
moments, scheduler and RNG states, what ``prioreplay learner`` needs to resume the run) and the
published versions ``checkpoints/published/v-N/`` (the weights the workers load). For
SmolLM2-135M a checkpoint is about 1.6 GB and a published version 0.5 GB. Once every child has
stopped the demo keeps the newest of each (``--keep-trainer-state``, the default), or with
``--no-keep-trainer-state`` (``prioreplay compare``'s arms) the newest published version only: the
final weights, which the report was scored with, without what a resume needs.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger("prioreplay.apps.demo")

GB = 1e9


def prune_published(run_dir: Path) -> list[Path]:
    """Delete the published versions but the newest (each version of SmolLM2 is ~0.5 GB: a run of
    15 learner steps kept 7.6 GB of them). Returns the deleted directories."""
    from prioreplay.learner.checkpoint import prune_published as prune

    published = run_dir / "checkpoints" / "published"
    gone = prune(published, keep=1, grace_s=0.0) if published.is_dir() else []
    if gone:
        log.info("deleted %d superseded published versions of this run (%s keeps the newest)", len(gone), published)
    return gone


def drop_trainer_state(run_dir: Path) -> list[Path]:
    """Delete the run's checkpoints (``checkpoints/step-*`` and any unfinished temporary one),
    keeping the published versions; returns the deleted directories. The run can no longer be
    resumed; its final weights stay in the newest published version."""
    root = run_dir / "checkpoints"
    gone = sorted(p for p in root.glob("step-*") if p.is_dir()) + sorted(p for p in root.glob(".tmp-step-*") if p.is_dir())
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def size_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (a file's own size; 0 when it does not exist)."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _numbered(paths) -> list[Path]:
    """The directories ``NAME-<n>`` among ``paths``, by n (``v-10`` after ``v-9``)."""
    dirs = [p for p in paths if p.is_dir() and p.name.rpartition("-")[2].isdigit()]
    return sorted(dirs, key=lambda p: int(p.name.rpartition("-")[2]))


def disk_usage(run_dir: Path, trainer_state_kept: bool) -> dict[str, Any]:
    """The report's ``disk``: bytes of the run directory, its checkpoints (``step-N``: weights and
    optimizer state), its published versions (names in order, the newest last), and whether the
    trainer state was kept."""
    root = run_dir / "checkpoints"
    checkpoints = _numbered(root.glob("step-*"))
    published = _numbered((root / "published").glob("v-*"))
    return {
        "run_dir_bytes": size_bytes(run_dir),
        "checkpoint_bytes": sum(size_bytes(p) for p in checkpoints),
        "published_bytes": sum(size_bytes(p) for p in published),
        "checkpoints": [p.name for p in checkpoints],
        "published": [p.name for p in published],
        "trainer_state_kept": trainer_state_kept,
    }


def disk_line(run_dir: Path, disk: dict[str, Any]) -> str:
    """One line: how much the run directory holds, and what."""
    parts = []
    if disk["checkpoints"]:
        parts.append(
            f"checkpoints/{disk['checkpoints'][-1]} {disk['checkpoint_bytes'] / GB:.2f} GB "
            "(weights and optimizer state: `prioreplay learner` resumes from it)"
        )
    if disk["published"]:
        parts.append(f"published/{disk['published'][-1]} {disk['published_bytes'] / GB:.2f} GB (the final weights)")
    if not disk["trainer_state_kept"]:
        parts.append("trainer state dropped (--no-keep-trainer-state)")
    return f"disk: {run_dir} holds {disk['run_dir_bytes'] / GB:.2f} GB" + (": " + "; ".join(parts) if parts else "")
