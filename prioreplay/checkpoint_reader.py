"""Reading learner checkpoints: the format, its checks, and the newest complete one.

A checkpoint directory ``DIR/step-N/`` holds:

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

A *published policy version* ``PUBLISH_DIR/v-N/`` is lighter: the policy files only (weights in
the model's dtype, ``config.json``, tokenizer files) and the same manifest file with format
:data:`WEIGHTS_FORMAT`, the version, the number of tensors and every file's size and CRC-32 (an
integrity check against partial or damaged files, 2-3x cheaper than sha256 on the publish path),
again written last and the directory renamed into place. It is not fsynced: a version lost in a
machine crash is refused by the workers' check and replaced by the next publish. Workers load a version only after
:func:`verify_weights` accepted it. Publishing happens every ``publish_every`` learner steps,
full checkpoints every ``checkpoint_every`` steps (issue 15, item 4).

The learner writes checkpoints (``prioreplay.learner.checkpoint``); the demo, the evaluation and the
workers read them, so reading lives here, in the core (standard library only).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from prioreplay.errors import FailedPrecondition

log = logging.getLogger(__name__)

MANIFEST = "prioreplay.json"
TRAINER_STATE = "trainer_state.pt"
FORMAT = "prioreplay-checkpoint/1"
WEIGHTS_FORMAT = "prioreplay-weights/1"
STEP_RE = re.compile(r"^step-(\d+)$")
VERSION_RE = re.compile(r"^v-(\d+)$")


class CheckpointError(FailedPrecondition):
    """A checkpoint is partial, tampered with or not a prioreplay checkpoint."""


def step_dir(root: str | os.PathLike, step: int) -> Path:
    """``root/step-N``."""
    return Path(root) / f"step-{int(step)}"


def crc32(path: Path) -> str:
    """CRC-32 of a file as 8 hex digits (zlib; the cheap integrity check of published versions)."""
    import zlib

    c = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            c = zlib.crc32(chunk, c)
    return f"{c & 0xFFFFFFFF:08x}"


def version_dir(root: str | os.PathLike, version: int) -> Path:
    """``root/v-N``: where policy version N is published."""
    return Path(root) / f"v-{int(version)}"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
    m = STEP_RE.match(path.name)
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
        raise CheckpointError(
            f"checkpoint {str(path)!r}: manifest says step {manifest.get('step')!r}, the name says {m.group(1)}"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or TRAINER_STATE not in files or "model.safetensors" not in files:
        raise CheckpointError(f"checkpoint {str(path)!r}: manifest lists no {TRAINER_STATE} / model.safetensors")
    for name, meta in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {str(path)!r}: file {name!r} is missing")
        if f.stat().st_size != meta.get("size"):
            raise CheckpointError(
                f"checkpoint {str(path)!r}: file {name!r} has {f.stat().st_size} bytes, the manifest says {meta.get('size')}"
            )
        if hashes and sha256(f) != meta.get("sha256"):
            raise CheckpointError(f"checkpoint {str(path)!r}: file {name!r} does not match its sha256 in the manifest (altered)")
    return manifest


def candidates(root: Path) -> list[tuple[int, Path]]:
    out = []
    if root.is_dir():
        for p in root.iterdir():
            m = STEP_RE.match(p.name)
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
    for _, p in candidates(Path(root)):
        try:
            verify(p)
        except CheckpointError as e:
            log.warning("skipping incomplete checkpoint: %s", e)
            continue
        return p
    return None


def _check_files(path: Path, files: Any, hashes: bool) -> None:
    """Every listed file exists with its size (and sha256 when ``hashes``)."""
    if not isinstance(files, dict):
        raise CheckpointError(f"{str(path)!r}: the manifest lists no files")
    for name, meta in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{str(path)!r}: file {name!r} is missing")
        if f.stat().st_size != meta.get("size"):
            raise CheckpointError(
                f"{str(path)!r}: file {name!r} has {f.stat().st_size} bytes, the manifest says {meta.get('size')}"
            )
        if hashes and "crc32" in meta and crc32(f) != meta.get("crc32"):
            raise CheckpointError(f"{str(path)!r}: file {name!r} does not match its crc32 in the manifest (altered)")
        if hashes and "crc32" not in meta and sha256(f) != meta.get("sha256"):
            raise CheckpointError(f"{str(path)!r}: file {name!r} does not match its sha256 in the manifest (altered)")


def verify_weights(path: str | os.PathLike, hashes: bool = True) -> dict[str, Any] | None:
    """Check that a weights directory a worker is asked to load is complete; return its manifest.

    - a published version (``v-N``, manifest format :data:`WEIGHTS_FORMAT`): every listed file with
      its size and (``hashes``) its CRC-32, and ``model.safetensors`` listed with its tensor count;
    - a full checkpoint (``step-N``): :func:`verify`;
    - a plain model directory without a manifest (written by another trainer): None. The caller's
      load still refuses it unless every tensor of the model is in it (all or nothing).

    Raises:
        CheckpointError: the directory is missing (pruned, never written), or its manifest is
            unreadable, of another format, or a listed file is missing, resized or altered.
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(
            f"weights directory {str(path)!r} does not exist (pruned, or never written): the version cannot be loaded"
        )
    mpath = path / MANIFEST
    if not mpath.exists():
        return None
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{str(path)!r}: {MANIFEST} cannot be read: {e}") from None
    fmt = manifest.get("format") if isinstance(manifest, dict) else None
    if fmt == FORMAT:
        return verify(path, hashes=hashes)
    if fmt != WEIGHTS_FORMAT:
        raise CheckpointError(f"{str(path)!r}: {MANIFEST} is neither a {FORMAT} nor a {WEIGHTS_FORMAT} manifest")
    files = manifest.get("files")
    if not isinstance(files, dict) or "model.safetensors" not in files or not isinstance(manifest.get("tensors"), int):
        raise CheckpointError(f"{str(path)!r}: the manifest lists no model.safetensors with its tensor count")
    _check_files(path, files, hashes)
    return manifest


def published_versions(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """(version, directory) of every ``v-N`` under ``root``, newest first (complete or not)."""
    out = []
    root = Path(root)
    if root.is_dir():
        for p in root.iterdir():
            m = VERSION_RE.match(p.name)
            if m and p.is_dir():
                out.append((int(m.group(1)), p))
    return sorted(out, reverse=True)
