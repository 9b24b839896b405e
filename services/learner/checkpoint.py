"""Learner checkpoints: ``DIR/step-N/`` written through a temporary directory and an atomic rename.

A checkpoint directory holds:

- the policy: ``model.safetensors``, ``config.json`` and the tokenizer files
  (:func:`prioreplay.models.save_weights`), which is what workers load for policy version N;
- ``trainer_state.pt``: optimizer and scheduler state dicts, step, policy version and the torch /
  python RNG states, as tensors and plain containers only, so ``torch.load(weights_only=True)``
  reads it (nothing is unpickled);
- ``prioreplay.json``: the manifest, written last: format, step, policy version, the learner
  configuration, and every other file with its size (bytes) and sha256.

A checkpoint is *complete* when its name is ``step-N``, its manifest parses, names step N and
every listed file exists with the listed size and hash. :func:`latest_complete` returns the
complete checkpoint with the highest step and skips anything else (temporary directories left by
a crash, missing or altered files). :func:`verify` raises on an incomplete one, so a tampered or
partial checkpoint loaded explicitly is refused with the reason.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from prioreplay.errors import FailedPrecondition, InvalidArgument

log = logging.getLogger(__name__)

MANIFEST = "prioreplay.json"
TRAINER_STATE = "trainer_state.pt"
FORMAT = "prioreplay-checkpoint/1"
_STEP_RE = re.compile(r"^step-(\d+)$")
_TMP_PREFIX = ".tmp-step-"


class CheckpointError(FailedPrecondition):
    """A checkpoint is partial, tampered with or not a prioreplay checkpoint."""


def step_dir(root: str | os.PathLike, step: int) -> Path:
    """``root/step-N``."""
    return Path(root) / f"step-{int(step)}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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


def save_checkpoint(root: str | os.PathLike, step: int, model, tokenizer, trainer_state: dict[str, Any],
                    config: dict[str, Any] | None = None, keep: int | None = None) -> Path:
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
    import torch

    from prioreplay.models import save_weights

    if step < 0:
        raise InvalidArgument(f"checkpoint step ({step}) must be >= 0")
    if keep is not None and keep < 1:
        raise InvalidArgument(f"keep ({keep}) must be >= 1 checkpoints")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{_TMP_PREFIX}{step}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        save_weights(model, tokenizer, tmp)
        torch.save(trainer_state, tmp / TRAINER_STATE)
        try:
            torch.load(tmp / TRAINER_STATE, weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unpickling refusal is the caller's bug
            raise InvalidArgument(f"trainer_state must hold only tensors and plain containers: {e}") from e
        files = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
                files[p.relative_to(tmp).as_posix()] = {"size": p.stat().st_size, "sha256": _sha256(p)}
        manifest = {
            "format": FORMAT,
            "step": int(step),
            "policy_version": int(trainer_state.get("policy_version", step)),
            "created_unix_s": time.time(),
            "config": config or {},
            "files": files,
        }
        with open(tmp / MANIFEST, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        final = step_dir(root, step)
        if final.exists():  # an earlier run's step-N (complete or not): replace it
            trash = root / f"{_TMP_PREFIX}{step}-old-{uuid.uuid4().hex[:8]}"
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep is not None:
        prune(root, keep)
    return final


def verify(path: str | os.PathLike, hashes: bool = True) -> dict[str, Any]:
    """Check a checkpoint directory and return its manifest.

    ``hashes=False`` checks names and sizes only (fast; used when pruning).

    Raises:
        CheckpointError: the directory or manifest is missing or unparsable, the name is not
            ``step-N`` matching the manifest's step, a listed file is missing, has another size
            or another sha256, or ``trainer_state.pt`` / ``model.safetensors`` is not listed.
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r} is not a directory")
    m = _STEP_RE.match(path.name)
    if m is None:
        raise CheckpointError(f"checkpoint {str(path)!r}: the name must be step-N (a temporary or foreign directory)")
    mpath = path / MANIFEST
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {str(path)!r} has no {MANIFEST}: it is partial (interrupted while writing)") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {str(path)!r}: {MANIFEST} cannot be read: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {str(path)!r}: {MANIFEST} is not a {FORMAT} manifest")
    if manifest.get("step") != int(m.group(1)):
        raise CheckpointError(f"checkpoint {str(path)!r}: manifest says step {manifest.get('step')!r}, the name says {m.group(1)}")
    files = manifest.get("files")
    if not isinstance(files, dict) or TRAINER_STATE not in files or "model.safetensors" not in files:
        raise CheckpointError(f"checkpoint {str(path)!r}: manifest lists no {TRAINER_STATE} / model.safetensors")
    for name, meta in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {str(path)!r}: file {name!r} is missing")
        if f.stat().st_size != meta.get("size"):
            raise CheckpointError(f"checkpoint {str(path)!r}: file {name!r} has {f.stat().st_size} bytes, the manifest says {meta.get('size')}")
        if hashes and _sha256(f) != meta.get("sha256"):
            raise CheckpointError(f"checkpoint {str(path)!r}: file {name!r} does not match its sha256 in the manifest (altered)")
    return manifest


def _candidates(root: Path) -> list[tuple[int, Path]]:
    out = []
    if root.is_dir():
        for p in root.iterdir():
            m = _STEP_RE.match(p.name)
            if m and p.is_dir():
                out.append((int(m.group(1)), p))
    return sorted(out, reverse=True)


def latest_complete(root: str | os.PathLike) -> Path | None:
    """The complete checkpoint with the highest step under ``root``, or None.

    Temporary directories are never candidates; an incomplete ``step-N`` (missing files,
    manifest mismatch) is skipped with a warning and the next lower complete one is returned.
    The result is the highest complete step on disk, so it only moves forward as checkpoints are
    added (pruning keeps the newest).
    """
    for _, p in _candidates(Path(root)):
        try:
            verify(p)
        except CheckpointError as e:
            log.warning("skipping incomplete checkpoint: %s", e)
            continue
        return p
    return None


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
    for step, p in _candidates(root):
        try:
            verify(p, hashes=False)
            complete.append((step, p))
        except CheckpointError:
            incomplete.append((step, p))
    doomed = [p for _, p in complete[keep:]]
    if complete:
        newest = complete[0][0]
        doomed += [p for s, p in incomplete if s < newest]
        doomed += [p for p in root.iterdir() if p.name.startswith(_TMP_PREFIX) and p.is_dir()
                   and time.time() - p.stat().st_mtime > 3600]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed
