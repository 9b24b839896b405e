"""``cost-aware``: the heap share by expected signal per generated token. Lua branch ``cost-aware``."""

from __future__ import annotations

from typing import Literal

from .base import Pick, RetestThenHeap, SampleRequest, SamplerView
from .params import SamplerParams


def window_costs(view: SamplerView, members: list[str]) -> list[float]:
    """Expected completion tokens of each window problem: its running mean
    (:meth:`SamplerView.completion_tokens`), else the mean of the window problems that have one,
    else 1.0 (none known: the keys are the priorities, the heap's own order)."""
    known = [view.completion_tokens(m) for m in members]
    have = [t for t in known if t is not None and t > 0.0]
    fallback = sum(have) / len(have) if have else 1.0
    return [t if t is not None and t > 0.0 else fallback for t in known]


class CostAwareHeap(RetestThenHeap):
    """``cost-aware``: H takes, from the window of the top ``4·count`` of the heap, the ``count``
    problems with the largest expected signal per generated token,

        key_i = p_i(1 − p_i) / E[completion tokens_i]

    (the heap priority over the problem's running mean of completion tokens per completion,
    :func:`window_costs`; Knapsack RL: Li et al. 2025, "Knapsack RL: Unlocking Exploration of LLMs
    via Optimizing Budget Allocation", arXiv 2509.25849, value per unit of generation cost), in
    key order (ties: rank). R and F are the paper's. A problem never reported with token ids costs
    the window's mean, so unseen problems compete on their priority alone.
    """

    def take_from_heap(self, view: SamplerView, request: SampleRequest, count: int) -> list[Pick]:
        size = min(4 * count, view.heap_size())
        if size <= 0 or count <= 0:
            return []
        entries = [view.heap_entry(rank) for rank in range(size)]
        costs = window_costs(view, [m for _, m in entries])
        keys = sorted(
            ((prio / cost, rank) for rank, ((prio, _), cost) in enumerate(zip(entries, costs, strict=True))),
            key=lambda k: (-k[0], k[1]),
        )
        chosen = [rank for _, rank in keys[:count]]
        taken: dict[int, Pick] = {}
        for rank in sorted(chosen, reverse=True):  # highest rank first: the lower ranks stay valid
            taken[rank] = view.take_heap(rank)
        return [taken[rank] for rank in chosen]


class CostAwareParams(SamplerParams):
    """Parameters of ``cost-aware`` (none)."""

    name: Literal["cost-aware"] = "cost-aware"
