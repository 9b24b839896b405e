"""Writing learner checkpoints: ``DIR/step-N/`` through a temporary directory and an atomic rename.

The format and its checks (manifest, :func:`~prioreplay.checkpoint_reader.verify`,
:func:`~prioreplay.checkpoint_reader.latest_complete`) are :mod:`prioreplay.checkpoint_reader`; this module
writes checkpoints, reads the trainer state back, keeps the RNG states, and prunes old ones.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from prioreplay.checkpoint_reader import (
    FORMAT,
    MANIFEST,
    TRAINER_STATE,
    WEIGHTS_FORMAT,
    CheckpointError,
    candidates,
    crc32,
    published_versions,
    sha256,
    step_dir,
    verify,
    version_dir,
)
from prioreplay.errors import InvalidArgument

_TMP_PREFIX = ".tmp-step-"
_TMP_VERSION_PREFIX = ".tmp-v-"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict[str, Any]:
    """torch (CPU and CUDA) and python RNG states as tensors / plain containers (weights_only-safe)."""
    import torch

    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    import torch

    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: str | os.PathLike,
    step: int,
    model,
    tokenizer,
    trainer_state: dict[str, Any],
    config: dict[str, Any] | None = None,
    keep: int | None = None,
) -> Path:
    """Write ``root/step-N/`` atomically and return its path.

    Everything is written into ``root/.tmp-step-N-<random>/``, each file fsynced, the manifest
    last; then the directory is renamed to ``step-N`` (an existing ``step-N`` left by an earlier,
    interrupted run is replaced). A crash at any point leaves either no ``step-N`` or a complete
    one. Afterwards, with ``keep``, only the newest ``keep`` complete checkpoints are kept.

    Args:
        root: the checkpoint directory (created if missing).
        step: the learner step N (>= 0); also the default policy version.
        model, tokenizer: passed to :func:`prioreplay.models.save_weights`.
        trainer_state: tensors and plain containers only (checked by reading it back with
            ``torch.load(weights_only=True)``); must hold ``step`` and ``policy_version``.
        config: the learner configuration (JSON-serializable), recorded in the manifest.
        keep: prune to this many complete checkpoints (>= 1), or None to keep all.

    Raises:
        InvalidArgument: negative step, keep < 1, or trainer_state not loadable with weights_only.
        OSError: the disk refused a write (the temporary directory is removed).
    """
    if step < 0:
        raise InvalidArgument(f"checkpoint step ({step}) must be >= 0")
    if keep is not None and keep < 1:
        raise InvalidArgument(f"keep ({keep}) must be >= 1 checkpoints")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{_TMP_PREFIX}{step}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _write_files(tmp, step, model, tokenizer, trainer_state, config)
        final = step_dir(root, step)
        _rename_into_place(tmp, final, root / f"{_TMP_PREFIX}{step}-old-{uuid.uuid4().hex[:8]}")
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep is not None:
        prune(root, keep)
    return final


def _write_files(
    directory: Path, step: int, model, tokenizer, trainer_state: dict[str, Any], config: dict[str, Any] | None
) -> None:
    """Weights, trainer state and, last, the manifest into ``directory``, each file fsynced."""
    import torch

    from prioreplay.models import save_weights

    save_weights(model, tokenizer, directory)
    torch.save(trainer_state, directory / TRAINER_STATE)
    try:
        torch.load(directory / TRAINER_STATE, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling refusal is the caller's bug
        raise InvalidArgument(f"trainer_state must hold only tensors and plain containers: {e}") from e
    files = _fsync_and_list(directory)
    manifest = {
        "format": FORMAT,
        "step": int(step),
        "policy_version": int(trainer_state.get("policy_version", step)),
        "created_unix_s": time.time(),
        "config": config or {},
        "files": files,
    }
    _write_manifest(directory, manifest)


def publish_weights(
    root: str | os.PathLike, version: int, step: int, model, tokenizer, dtype=None, keep: int | None = None, grace_s: float = 0.0
) -> Path:
    """Write policy version N, the weights only, to ``root/v-N/`` atomically; return its path.

    The policy files (:func:`prioreplay.models.save_weights`, floating tensors in ``dtype``) go
    into a temporary directory, then the manifest (format
    :data:`~prioreplay.checkpoint_reader.WEIGHTS_FORMAT`: version, step, tensor count, every file's size
    and CRC-32) last; the directory is then renamed to ``v-N``. Nothing is fsynced (publishing is
    on every step's path; a version a machine crash damaged fails the workers' check and the next
    publish replaces it). A worker that finds ``v-N``
    therefore finds it whole (:func:`prioreplay.checkpoint_reader.verify_weights`). No optimizer state
    is written: that is :func:`save_checkpoint`'s job, every ``checkpoint_every`` steps.
    Afterwards, with ``keep``, older versions are pruned by :func:`prune_published`.

    Args:
        root: the publish directory (created if missing; e.g. on ``/dev/shm`` for one node).
        version: the policy version N (>= 1).
        step: the learner step whose weights these are (recorded in the manifest).
        dtype: torch floating dtype of the written tensors (None: as trained).
        keep, grace_s: see :func:`prune_published`.

    Raises:
        InvalidArgument: version < 1 or keep < 1.
        OSError: the disk refused a write (the temporary directory is removed).
    """
    from prioreplay.models import save_weights

    if version < 1:
        raise InvalidArgument(f"policy version ({version}) must be >= 1")
    if keep is not None and keep < 1:
        raise InvalidArgument(f"keep ({keep}) must be >= 1 published versions")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{_TMP_VERSION_PREFIX}{version}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        save_weights(model, tokenizer, tmp, dtype=dtype)
        _write_manifest(tmp, _weights_manifest(tmp, version, step), sync=False)
        final = version_dir(root, version)
        _rename_into_place(tmp, final, root / f"{_TMP_VERSION_PREFIX}{version}-old-{uuid.uuid4().hex[:8]}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep is not None:
        prune_published(root, keep, grace_s)
    return final


def _weights_manifest(directory: Path, version: int, step: int) -> dict[str, Any]:
    """The manifest of a published version in ``directory``: version, step, the safetensors'
    tensor count, every file's size and CRC-32."""
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), framework="pt") as fh:
        n_tensors = len(list(fh.keys()))
    files = {
        p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "crc32": crc32(p)}
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }
    return {
        "format": WEIGHTS_FORMAT,
        "version": int(version),
        "step": int(step),
        "tensors": n_tensors,
        "created_unix_s": time.time(),
        "files": files,
    }


def _rename_into_place(tmp: Path, final: Path, trash: Path) -> None:
    """Rename the finished ``tmp`` to ``final``; an existing ``final`` (an earlier, interrupted
    run's, complete or not) is first renamed to ``trash`` and deleted."""
    if final.exists():
        os.rename(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.rename(tmp, final)


def prune_published(root: str | os.PathLike, keep: int, grace_s: float, now: float | None = None) -> list[Path]:
    """Delete old published versions that no worker may still be loading; return what was deleted.

    A worker loads the version named in its lease right after leasing, so version V can still be
    asked for until shortly after V + 1 was published. V is deleted only when it is not among the
    newest ``keep`` versions **and** the next newer version was published more than ``grace_s``
    seconds ago (so no version newer than the oldest one a worker may still load is ever deleted,
    and the newest is never). Temporary directories older than an hour go too.

    Raises:
        InvalidArgument: keep < 1 or grace_s < 0.
    """
    if keep < 1:
        raise InvalidArgument(f"keep ({keep}) must be >= 1 published versions")
    if grace_s < 0:
        raise InvalidArgument(f"grace_s ({grace_s}) must be >= 0 seconds")
    root = Path(root)
    now = time.time() if now is None else now
    versions = published_versions(root)
    doomed = []
    for i in range(keep, len(versions)):
        successor = versions[i - 1][1]
        if now - _published_at(successor) > grace_s:
            doomed.append(versions[i][1])
    if root.is_dir():
        doomed += [
            p for p in root.iterdir() if p.name.startswith(_TMP_VERSION_PREFIX) and p.is_dir() and now - p.stat().st_mtime > 3600
        ]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def _published_at(path: Path) -> float:
    """When a published version was written (its manifest's time, else the directory's mtime)."""
    try:
        return float(json.loads((path / MANIFEST).read_text(encoding="utf-8"))["created_unix_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return path.stat().st_mtime


def _fsync_and_list(directory: Path) -> dict[str, dict[str, Any]]:
    """fsync every file under ``directory``; {relative name: {size, sha256}}."""
    files = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
            files[p.relative_to(directory).as_posix()] = {"size": p.stat().st_size, "sha256": sha256(p)}
    return files


def _write_manifest(directory: Path, manifest: dict[str, Any], sync: bool = True) -> None:
    with open(directory / MANIFEST, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    if sync:
        _fsync_dir(directory)


def load_trainer_state(path: str | os.PathLike, map_location: str = "cpu") -> dict[str, Any]:
    """Verify a checkpoint and read its ``trainer_state.pt`` with ``torch.load(weights_only=True)``.

    Raises:
        CheckpointError: the checkpoint is incomplete or altered (see :func:`verify`).
    """
    import torch

    verify(path)
    return torch.load(Path(path) / TRAINER_STATE, map_location=map_location, weights_only=True)


def prune(root: str | os.PathLike, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints, plus stale temporary directories
    and incomplete ``step-N`` directories older than the newest complete one. Returns what was
    deleted. Never deletes the newest complete checkpoint.

    Raises:
        InvalidArgument: keep < 1.
    """
    if keep < 1:
        raise InvalidArgument(f"keep ({keep}) must be >= 1 checkpoints")
    root = Path(root)
    complete, incomplete = [], []
    for step, p in candidates(root):
        try:
            verify(p, hashes=False)
            complete.append((step, p))
        except CheckpointError:
            incomplete.append((step, p))
    doomed = [p for _, p in complete[keep:]]
    if complete:
        newest = complete[0][0]
        doomed += [p for s, p in incomplete if s < newest]
        doomed += [
            p for p in root.iterdir() if p.name.startswith(_TMP_PREFIX) and p.is_dir() and time.time() - p.stat().st_mtime > 3600
        ]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed
