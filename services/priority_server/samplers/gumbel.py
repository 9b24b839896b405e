"""``gumbel``: the heap share as a Gumbel-top-k draw over the top of the heap. Lua branch ``gumbel``."""

from __future__ import annotations

import math
from typing import Literal

from .base import Pick, RetestThenHeap, SampleRequest, SamplerView
from .params import SamplerParams, gumbel_temperature_field


class GumbelHeap(RetestThenHeap):
    """``gumbel``: H is a Gumbel-top-k draw (Kool et al. 2019, "Stochastic Beams and Where to Find
    Them", arXiv 1903.06059) over the window of the top ``4·count`` of the heap: each window
    problem at rank i gets key_i = log(max(priority_i, 1e-12)) / T − log(−log(u_i)) with
    u_i = max(rng.random(), 2⁻³²) drawn in rank order; the ``count`` largest keys are taken, in key
    order (ties: rank). This samples without replacement ∝ priority^(1/T) within the window, so a
    mixed problem of lower priority is still served; T = ``self.params.gumbel_temperature``."""

    params: GumbelParams

    def take_from_heap(self, view: SamplerView, request: SampleRequest, count: int) -> list[Pick]:
        size = min(4 * count, view.heap_size())
        if size <= 0 or count <= 0:
            return []
        t, rng = self.params.gumbel_temperature, request.seeded_rng
        keys = []
        for rank in range(size):
            u = max(rng.random(), 2.0**-32)
            prio = view.heap_entry(rank)[0]
            keys.append((math.log(max(prio, 1e-12)) / t - math.log(-math.log(u)), rank))
        keys.sort(key=lambda k: (-k[0], k[1]))
        chosen = [rank for _, rank in keys[:count]]
        taken: dict[int, Pick] = {}
        for rank in sorted(chosen, reverse=True):  # highest rank first: the lower ranks stay valid
            taken[rank] = view.take_heap(rank)
        return [taken[rank] for rank in chosen]


class GumbelParams(SamplerParams):
    """Parameters of ``gumbel``: ``gumbel_temperature``."""

    name: Literal["gumbel"] = "gumbel"
    gumbel_temperature: float = gumbel_temperature_field()
