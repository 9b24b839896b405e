"""``screened``: the paper's heap + retests, with problems never tested probed first (SPEED-RL).

Lua branch ``screened``; its spec has ``probes=True`` (only clients that accept a group size).
"""

from __future__ import annotations

from typing import Literal

from .base import RetestThenHeap
from .params import ProbeParams


class ScreenedSampler(RetestThenHeap):
    """``screened``: the paper's heap + retests, with problems never tested probed first
    (SPEED-RL: Zhang et al. 2025, "SPEED-RL: Faster Training of Reasoning Models via Online
    Curriculum Learning", arXiv 2506.09016, screening rollouts). A probe group of ``probe_size``
    completions updates the statistics like any report; all-correct / all-wrong probes go to the
    pools, a mixed probe stays at the top of the heap, so a full group follows only there."""

    probe_unseen = True


class ScreenedParams(ProbeParams):
    """Parameters of ``screened``: ``probe_size``."""

    name: Literal["screened"] = "screened"
