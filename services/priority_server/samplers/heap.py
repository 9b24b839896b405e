"""``heap``: the paper's sampler. Due retests, then the top of the heap, then a fill from the pools.

Draws no random numbers; Lua branch ``heap`` in ``lua/sample.lua``.
"""

from __future__ import annotations

from typing import Literal

from .base import RetestThenHeap
from .params import SamplerParams


class HeapSampler(RetestThenHeap):
    """``heap`` (Fatemi, arXiv 2601.02648): H is the top of the heap, in heap order; R the due
    retests, least recently tested first. Draws no random numbers."""


class HeapParams(SamplerParams):
    """Parameters of ``heap`` (none)."""

    name: Literal["heap"] = "heap"
