"""The memory store's :class:`~prioreplay.priority_server.samplers.SamplerView`: the heap and the
pools as SortedLists, read and taken from in place (one view per store, built once)."""

from __future__ import annotations

from sortedcontainers import SortedList

from prioreplay.rules import Pool, Stats

from ..samplers import Pick
from .contract import member_id
from .snapshot import Entry


class MemorySamplerView:
    """:class:`~.samplers.SamplerView` over a memory store's heap and pools (heap order is read
    from the end of the ascending heap list, by negative index: SortedList's fast path)."""

    __slots__ = ("_heap", "_pools", "_problems", "_tokens")

    def __init__(
        self, heap: SortedList, pools: dict[Pool, SortedList], problems: dict[str, Entry], tokens: dict[str, tuple[float, float]]
    ):
        self._heap, self._pools, self._problems, self._tokens = heap, pools, problems, tokens

    def heap_size(self) -> int:
        return len(self._heap)

    def heap_entry(self, rank: int) -> tuple[float, str]:
        return self._heap[-1 - rank]  # negative: SortedList's fast path near the top

    def pool_size(self, pool: Pool) -> int:
        return len(self._pools[pool])

    def pool_entry(self, pool: Pool, index: int) -> tuple[float, str]:
        return self._pools[pool][index]

    def problem_stats(self, member: str) -> Stats:
        return self._problems[member_id(member)].stats

    def completion_tokens(self, member: str) -> float | None:
        t = self._tokens.get(member_id(member))
        return t[1] / t[0] if t is not None and t[0] > 0.0 else None

    def problem_prompt(self, member: str) -> str:
        return self._problems[member_id(member)].record.prompt

    def take_heap(self, rank: int) -> Pick:
        _, member = self._heap.pop(-1 - rank)
        return Pick(member, Pool.HEAP)

    def take_pool(self, pool: Pool, index: int) -> Pick:
        _, member = self._pools[pool].pop(index)
        return Pick(member, pool)
