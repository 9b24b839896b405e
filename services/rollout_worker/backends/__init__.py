"""Imports as prioreplay.rollout_worker.backends: the generation backends (transformers, vLLM).

The interface is :mod:`.base`; each backend is a module imported only when built, so importing
this package needs neither torch nor vLLM.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prioreplay.errors import InvalidArgument

from .base import GenerationBackend


def create_backend(name: str, model_dir: Path, device: str = "cpu", **kwargs: Any) -> GenerationBackend:
    """Build the backend ``name`` ("transformers" or "vllm") for the model directory.

    Raises:
        InvalidArgument: unknown backend name; vllm not installed (for "vllm").
    """
    if name == "transformers":
        from .transformers_backend import TransformersBackend

        return TransformersBackend(model_dir, device=device, **kwargs)
    if name == "vllm":
        from .vllm_backend import VLLMBackend

        return VLLMBackend(model_dir, **kwargs)
    raise InvalidArgument(f"backend ({name!r}) must be 'transformers' or 'vllm'")
