"""``screened-posterior``: screening probes + posterior retests. Lua branch ``screened-posterior``."""

from __future__ import annotations

from prioreplay.priority_server.samplers.posterior import PosteriorSampler


class ScreenedPosteriorSampler(PosteriorSampler):
    """``screened-posterior``: probes of problems never tested (as ``screened``), the heap's top,
    retests by the decayed posterior (as ``posterior``)."""

    probe_unseen = True
