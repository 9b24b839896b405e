"""The memory store's :class:`~prioreplay.priority_server.samplers.SamplerView`: the heap and the
pools as SortedLists, read and taken from in place (one view per store, built once)."""

from __future__ import annotations

from sortedcontainers import SortedList

from prioreplay.rules import Pool, Stats

from ..samplers import Pick
from .contract import UNSEEN_SCORE, member_id
from .snapshot import Entry

#: Sorts after every (UNSEEN_SCORE, member): members are 8 hex chars + an id.
_BAND_END = (UNSEEN_SCORE, "\U0010ffff")


class MemorySamplerView:
    """:class:`~.samplers.SamplerView` over a memory store's heap and pools (heap order is read
    from the end of the ascending heap list, by negative index: SortedList's fast path).

    With the prior for unseen problems on (:attr:`unseen` set by the store for each sample, ω_unseen),
    the heap's unseen band (score :data:`UNSEEN_SCORE`, the bottom of the list) is read as if each of
    its problems had priority ω_unseen: heap order is the merge of the seen problems (above the band)
    and the band by (priority, member) descending (store/base.py, "A prior for unseen problems").
    Rank r costs O(r + log N) then (``heap`` reads rank 0 only).
    """

    __slots__ = ("_heap", "_pools", "_problems", "_tokens", "unseen")

    def __init__(
        self, heap: SortedList, pools: dict[Pool, SortedList], problems: dict[str, Entry], tokens: dict[str, tuple[float, float]]
    ):
        self._heap, self._pools, self._problems, self._tokens = heap, pools, problems, tokens
        #: ω_unseen while the prior is on, else None (the heap list is read as it is).
        self.unseen: float | None = None

    def heap_size(self) -> int:
        return len(self._heap)

    def _merged(self, rank: int) -> tuple[int, float]:
        """(index in the heap list, priority) of the problem at ``rank`` in heap order with the
        unseen band at ω_unseen: a merge from the top of the seen part and of the band."""
        assert self.unseen is not None
        band = self._heap.bisect_left(_BAND_END)  # the band is heap[:band]
        seen, unseen, n = len(self._heap) - 1, band - 1, len(self._heap)
        for _ in range(rank + 1):
            if seen >= band and (unseen < 0 or self._heap[seen] > (self.unseen, self._heap[unseen][1])):
                at, prio, seen = seen, self._heap[seen][0], seen - 1
            elif unseen >= 0:
                at, prio, unseen = unseen, self.unseen, unseen - 1
            else:
                raise IndexError(f"heap rank {rank} out of range for {n} problems")
        return at, prio

    def heap_entry(self, rank: int) -> tuple[float, str]:
        if self.unseen is None:
            return self._heap[-1 - rank]  # negative: SortedList's fast path near the top
        at, prio = self._merged(rank)
        return prio, self._heap[at][1]

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
        _, member = self._heap.pop(-1 - rank if self.unseen is None else self._merged(rank)[0])
        return Pick(member, Pool.HEAP)

    def take_pool(self, pool: Pool, index: int) -> Pick:
        _, member = self._pools[pool].pop(index)
        return Pick(member, pool)

    def unseen_in_heap(self) -> int:
        """Problems of the heap's unseen band (score :data:`UNSEEN_SCORE`; none while the prior is off)."""
        return self._heap.bisect_left(_BAND_END)
