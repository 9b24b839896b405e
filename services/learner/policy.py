"""The policy a learner trains: device, weights (full or LoRA), reference model, optimizer and schedule.

Set-up helpers of :class:`~.learner.Learner`, kept apart so that its step reads top to bottom.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import torch

from prioreplay.errors import InvalidArgument


def pick_device(device: str) -> str:
    """The torch device of ``device`` (``auto``: cuda if available, else cpu).

    Raises:
        InvalidArgument: a CUDA device on a machine without CUDA.
    """
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidArgument(f"device ({device!r}) needs CUDA, which this machine lacks; use --device cpu")
    return device


def wrap_lora(model, rank: int):
    """``model`` with LoRA adapters of rank ``rank`` (alpha = 2·rank) on every linear layer.

    Raises:
        InvalidArgument: peft is not installed.
    """
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise InvalidArgument(
            "lora=True needs peft: install the extra with `pip install 'prioreplay[lora]'`, or train all weights (--no-lora)"
        ) from None
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)


def optimizer_and_schedule(model, lr: float, weight_decay: float, warmup_steps: int):
    """AdamW over the trainable parameters and a linear warm-up from 0 to ``lr`` over
    ``warmup_steps`` steps (then constant). Returns ``(optimizer, scheduler)``."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    )
    return optimizer, scheduler


def autocast(device: torch.device):
    """bfloat16 autocast on CUDA; no autocast elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def reference(model, ref_model):
    """The reference policy of the KL term: ``ref_model`` if loaded, else (LoRA) ``model`` with
    its adapters switched off."""
    if ref_model is not None:
        yield ref_model
    else:
        with model.disable_adapter():
            yield model


def mergeable(model, lora: bool):
    """The model to save: ``model`` itself, or (LoRA) a copy with the adapters merged in."""
    if not lora:
        return model
    return copy.deepcopy(model).merge_and_unload()


def publish_dtype(name: str, model_dir: Path) -> torch.dtype | None:
    """The torch dtype published weights are written in: ``auto`` reads the model's own
    (``torch_dtype`` / ``dtype`` in config.json); None keeps the training dtype."""
    if name == "auto":
        try:
            cfg = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        name = cfg.get("torch_dtype") or cfg.get("dtype") or ""
    dtype = getattr(torch, str(name), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None
