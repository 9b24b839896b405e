"""``screened-pools``: ``screened``, and the retests are probes too. Lua branch ``screened-pools``."""

from __future__ import annotations

from typing import Literal

from .base import RetestThenHeap
from .params import ProbeParams


class ScreenedPoolsSampler(RetestThenHeap):
    """``screened-pools``: problems never tested and the due retests R are served with
    ``probe_size`` completions; the fill F and tested heap problems get the worker's G."""

    probe_unseen = True
    probe_retests = True


class ScreenedPoolsParams(ProbeParams):
    """Parameters of ``screened-pools``: ``probe_size``."""

    name: Literal["screened-pools"] = "screened-pools"
