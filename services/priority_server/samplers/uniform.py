"""``uniform``: the baseline, uniform over every problem not leased. Lua branch ``uniform``."""

from __future__ import annotations

import math
from typing import Literal

from prioreplay.rules import Pool

from .base import MemorySampler, Pick, SampleRequest, SamplerView
from .params import SamplerParams


class UniformSampler(MemorySampler):
    """``uniform`` (the baseline): each slot draws idx = ⌊u·N⌋ over the concatenation [heap in
    heap order, solved in pool order, unsolved in pool order] of the N problems not leased.
    No retest quota (its spec has ``retests=False``)."""

    def sample(self, view: SamplerView, request: SampleRequest) -> list[Pick]:
        picks: list[Pick] = []
        for _ in range(request.batch_size):
            nh, ns = view.heap_size(), view.pool_size(Pool.SOLVED)
            n = nh + ns + view.pool_size(Pool.UNSOLVED)
            if n == 0:
                break
            idx = min(math.floor(request.seeded_rng.random() * n), n - 1)
            if idx < nh:
                picks.append(view.take_heap(idx))
            elif idx < nh + ns:
                picks.append(view.take_pool(Pool.SOLVED, idx - nh))
            else:
                picks.append(view.take_pool(Pool.UNSOLVED, idx - nh - ns))
        return picks


class UniformParams(SamplerParams):
    """Parameters of ``uniform`` (none)."""

    name: Literal["uniform"] = "uniform"
