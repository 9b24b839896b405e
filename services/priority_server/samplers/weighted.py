"""``weighted``: the heap share drawn ∝ priority^alpha by rejection. Lua branch ``weighted``."""

from __future__ import annotations

import math
from typing import Literal

from prioreplay.rules import MAX_PRIORITY

from .base import Pick, RetestThenHeap, SampleRequest, SamplerView
from .params import SamplerParams, alpha_field

#: Rejection tries per slot before the slot takes the top of the heap.
MAX_TRIES = 8


class WeightedSampler(RetestThenHeap):
    """``weighted``: each H slot draws a rank uniformly over the remaining heap and accepts it with
    probability (priority / 0.25)^alpha, at most :data:`MAX_TRIES` tries, else the top (so
    ∝ priority^alpha by rejection). Two draws per try: u1 for the rank, u2 for the acceptance."""

    params: WeightedParams

    def take_from_heap(self, view: SamplerView, request: SampleRequest, count: int) -> list[Pick]:
        rng, alpha = request.seeded_rng, self.params.alpha
        picks: list[Pick] = []
        for _ in range(count):
            size = view.heap_size()
            if size == 0:
                break
            chosen = 0  # the top, when every try is rejected
            for _try in range(MAX_TRIES):
                rank = min(math.floor(rng.random() * size), size - 1)
                if rng.random() < (view.heap_entry(rank)[0] / MAX_PRIORITY) ** alpha:
                    chosen = rank
                    break
            picks.append(view.take_heap(chosen))
        return picks


class WeightedParams(SamplerParams):
    """Parameters of ``weighted``: ``alpha``."""

    name: Literal["weighted"] = "weighted"
    alpha: float = alpha_field()
