"""Settings of ``prioreplay model NAME`` (pydantic only: ``--help`` stays fast)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import CliPositionalArg

from prioreplay.config import PrioreplaySettings


class ModelConfig(PrioreplaySettings):
    """Prepare a model: convert an alias (``smollm2-135m``) into its model folder once, or check a
    local directory / cached Hugging Face id, and print the folder's path.

    The folder is the one ``prioreplay demo``, ``worker`` and ``learner`` create on first use
    (``$PRIOREPLAY_CACHE_DIR`` or ``~/.cache/prioreplay/models/<alias>``), so a TRL or verl script
    can be given it before any of them has run.
    """

    name: CliPositionalArg[str] = Field(description="an alias (smollm2-135m), a local model directory or a cached HF id")
    cache_dir: Path | None = Field(
        None, description="where alias conversions go (default $PRIOREPLAY_CACHE_DIR or ~/.cache/prioreplay/models)"
    )


def run(config: ModelConfig) -> int:
    """Resolve ``config.name`` (converting an alias on first use) and print the model folder.

    Returns:
        0; the path is the only line on stdout (``MODEL=$(prioreplay model smollm2-135m)``).

    Raises:
        InvalidArgument: an unknown name, an incomplete directory, or an alias whose package is not
            installed (``prioreplay.models.resolve_model``).
    """
    from prioreplay.models import resolve_model

    print(resolve_model(config.name, config.cache_dir))
    return 0
