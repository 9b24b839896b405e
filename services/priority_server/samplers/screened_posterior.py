"""``screened-posterior``: screening probes + posterior retests. Lua branch ``screened-posterior``."""

from __future__ import annotations

from typing import Literal

from .params import PosteriorRetestParams, ProbeParams
from .posterior import PosteriorSampler


class ScreenedPosteriorSampler(PosteriorSampler):
    """``screened-posterior``: probes of problems never tested (as ``screened``), the heap's top,
    retests by the decayed posterior (as ``posterior``)."""

    probe_unseen = True


class ScreenedPosteriorParams(ProbeParams, PosteriorRetestParams):
    """Parameters of ``screened-posterior``: ``probe_size``, ``posterior_decay``, ``posterior_prior``."""

    name: Literal["screened-posterior"] = "screened-posterior"
