"""``thompson``: the heap's top, retests by Thompson draws of the decayed posterior.

Memory store only (no Lua branch): the Beta draws use Python's ``random.Random``.
"""

from __future__ import annotations

import random
from typing import Literal

from .base import Pick, RetestThenHeap, SampleRequest, SamplerView
from .params import PosteriorRetestParams
from .posterior import WindowEntry, posterior_retests


class ThompsonSampler(RetestThenHeap):
    """``thompson``: as ``posterior``, but each window problem's score is p(1 − p) for one draw
    p ~ Beta(a, b) of its decayed posterior (Thompson sampling, as in MoPPS: a = prior + w·s1,
    b = prior + w·(n − s1), w = decay^age). The Beta draws use ``random.Random`` seeded with one
    draw of this step's RNG (taken only when the quota is > 0)."""

    params: PosteriorRetestParams

    def retests(self, view: SamplerView, request: SampleRequest) -> list[Pick]:
        if request.quota <= 0:
            return []
        draw = random.Random(request.seeded_rng.next_u32())
        c = self.params

        def score(entry: WindowEntry) -> float:
            st = view.problem_stats(entry[3])
            w = c.posterior_decay ** (request.pool_now - entry[0])
            p = draw.betavariate(c.posterior_prior + w * st.s1, c.posterior_prior + w * (st.n - st.s1))
            return p * (1.0 - p)

        return posterior_retests(view, request, score)


class ThompsonParams(PosteriorRetestParams):
    """Parameters of ``thompson``: ``posterior_decay``, ``posterior_prior``."""

    name: Literal["thompson"] = "thompson"
