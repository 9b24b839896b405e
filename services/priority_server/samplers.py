"""The sampler seam: every sampler is named once, here, with its in-process implementation and its
Lua branch. Configurations import the names from this module (:data:`SamplerName`).

A sampler decides which problems one ``sample`` call leases. Adding one touches this module (a
class and a row of :data:`SAMPLERS`), its branch in ``lua/sample.lua`` (when the Redis store
should run it) and a test, nothing else: both stores, the servicer and every configuration
(``prioreplay server --sampler``, ``prioreplay demo --sampler``, :class:`StoreConfig`) pick the
new name up from :data:`SAMPLERS`.

What a sampler gets
    * a :class:`SamplerView` of the problems not leased: the heap in heap order (priority desc,
      tie-break member desc; rank 0 is the top), each pool in pool order (last tested step asc,
      member asc; index 0 is the least recently tested), each problem's statistics
      (:class:`prioreplay.rules.Stats`: decayed n, Σr, Σr²), and ``take_*`` methods that lease a
      problem and remove it from the view at once (later draws of the same call see the rest);
    * a :class:`SampleRequest`: the batch size B, the batch's step (the global step the pools'
      scores are measured in), the retest quota (``retest_quota(B, f)``, 0 for samplers with
      ``retests=False``), the retest interval, and the seeded RNG of this step (a
      :class:`XorShift32` seeded with ``step_seed(seed, step)``, None for samplers with
      ``uses_rng=False``: derived from the step, so a restarted server draws the same);
    * its own parameters from :class:`StoreConfig` (given to the constructor).

What it returns
    The :class:`Pick` of every problem it took, in batch order. A pick may set ``group_size``:
    how many completions the worker should generate for that problem (None: the worker's own G).

Planned samplers and where they plug in (none is implemented yet)
    * Decayed Beta posterior, priority = expected variance under a Beta posterior whose evidence
      decays with the steps since the problem was last tested: a :class:`RetestThenHeap` whose
      ``take_from_heap`` scores heap problems from ``view.problem_stats(member)`` and ``request.step``.
      The step of a heap problem's last report is not stored yet (a pooled problem's score is
      its last tested step); the statistics record (memory ``_Entry``, Redis ``stats`` value)
      gains that one column.
    * Thompson-sampling or UCB retests instead of least-recently-first: override
      :meth:`RetestThenHeap.retests`, reading ``view.pool_entry``/``view.problem_stats`` and drawing
      from ``request.rng``.
    * Screening probes: return picks with a smaller ``group_size``. The SampleProblems response
      and the worker then carry it (``LeasedProblem`` needs the field).
    * Gumbel-top-k over log-priority with a temperature: override ``take_from_heap``; add the
      temperature to :class:`StoreConfig` next to ``alpha``.

The Redis store runs the sampler's Lua branch (``lua_branch``, a function in ``sample.lua``)
inside one script call, with the same RNG draws in the same order; the differential test checks
that both stores lease the same problems. A sampler without a Lua branch (None) runs in the
memory store only; the Redis store refuses it at construction.

This module imports only the standard library and :mod:`prioreplay.rules`, so configurations
(and ``prioreplay --help``) stay light.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from prioreplay.rules import MAX_PRIORITY, Pool, Stats

if TYPE_CHECKING:  # pragma: no cover
    from prioreplay.priority_server.store import StoreConfig


# -- the RNG and the retest quota ------------------------------------------------------------
def step_seed(seed: int, step: int) -> int:
    """The 32-bit non-zero seed of the sampler's RNG at batch ``step`` (restart-safe: derived)."""
    h = hashlib.blake2b(f"{seed}:{step}".encode(), digest_size=4).digest()
    return int.from_bytes(h, "big") or 1


class XorShift32:
    """Marsaglia's xorshift32 (13, 17, 5): the sampler's RNG, mirrored exactly in ``lua/lib.lua``
    (``xs_new``, ``xs_next``, ``xs_random``).

    Python's and Redis-Lua's arithmetic agree on it bit for bit (Lua uses the ``bit`` library),
    so the ``weighted`` and ``uniform`` samplers draw the same problems in both stores.
    """

    __slots__ = ("x",)
    _M = 0xFFFFFFFF

    def __init__(self, seed32: int):
        self.x = (seed32 & self._M) or 1

    def next_u32(self) -> int:
        x = self.x
        x ^= (x << 13) & self._M
        x ^= x >> 17
        x ^= (x << 5) & self._M
        self.x = x
        return x

    def random(self) -> float:
        """A float in [0, 1): next_u32() / 2³²."""
        return self.next_u32() / 4294967296.0


def retest_quota(batch_size: int, retest_fraction: float) -> int:
    """Problems of a batch reserved for pool retests: ⌊f·B⌋, but at least 1 when f > 0.

    The floor of one keeps retests alive for small batches, so no pooled problem starves.
    """
    if retest_fraction <= 0.0:
        return 0
    return max(1, int(math.floor(batch_size * retest_fraction)))


# -- what a sampler sees and returns ----------------------------------------------------------
@dataclass(frozen=True)
class Pick:
    """One problem a sampler took.

    Attributes:
        member: its sorted-set member (``store.tie_member``: tie-break key + id).
        source: where it came from (HEAP, SOLVED or UNSOLVED); it returns there if not reported.
        group_size: completions the worker should generate for it; None: the worker's own G.
    """

    member: str
    source: Pool
    group_size: int | None = None


@dataclass(frozen=True)
class SampleRequest:
    """One ``sample`` call, as a sampler sees it.

    Attributes:
        batch_size: B, problems wanted (>= 1); a sampler returns at most B picks.
        step: the step of this batch (1 for the first); pooled problems' scores are steps too.
        quota: problems reserved for pool retests (0 when the sampler does not retest).
        retest_interval: batches a pooled problem waits before it is due for a retest.
        rng: this step's seeded RNG, or None for a sampler with ``uses_rng=False``.
    """

    batch_size: int
    step: int
    quota: int
    retest_interval: int
    rng: XorShift32 | None


class SamplerView(Protocol):
    """The problems not leased, as one ``sample`` call sees them (the memory store's view)."""

    def heap_size(self) -> int:
        """Problems in the heap."""

    def heap_entry(self, rank: int) -> tuple[float, str]:
        """(priority, member) of the problem at ``rank`` in heap order (0: the top)."""

    def pool_size(self, pool: Pool) -> int:
        """Problems in the SOLVED or UNSOLVED pool."""

    def pool_entry(self, pool: Pool, index: int) -> tuple[float, str]:
        """(last tested step, member) at ``index`` in pool order (0: least recently tested)."""

    def problem_stats(self, member: str) -> Stats:
        """The problem's decayed reward sums."""

    def take_heap(self, rank: int) -> Pick:
        """Lease the heap problem at ``rank``; it leaves the view at once."""

    def take_pool(self, pool: Pool, index: int) -> Pick:
        """Lease the pooled problem at ``index``; it leaves the view at once."""


class MemorySampler:
    """A sampler's in-process implementation (the memory store runs it; the oracle for Lua).

    Args:
        config: the store configuration (``alpha`` and any sampler parameter live there).
    """

    def __init__(self, config: "StoreConfig") -> None:
        self.config = config

    def sample(self, view: SamplerView, request: SampleRequest) -> list[Pick]:
        """Take up to ``request.batch_size`` problems from ``view``; return them in batch order."""
        raise NotImplementedError


_POOL_RANK = {Pool.SOLVED: 0, Pool.UNSOLVED: 1}


def take_from_pools(view: SamplerView, count: int, max_score: float | None) -> list[Pick]:
    """Up to ``count`` pooled problems in merged pool order (score asc, solved before unsolved,
    member asc), only those with score <= ``max_score`` (None: any score)."""
    picks: list[Pick] = []
    while len(picks) < count:
        head: tuple[tuple[float, int, str], Pool] | None = None
        for pool in (Pool.SOLVED, Pool.UNSOLVED):
            if view.pool_size(pool):
                score, member = view.pool_entry(pool, 0)
                key = (score, _POOL_RANK[pool], member)
                if head is None or key < head[0]:
                    head = (key, pool)
        if head is None or (max_score is not None and head[0][0] > max_score):
            break
        picks.append(view.take_pool(head[1], 0))
    return picks


class RetestThenHeap(MemorySampler):
    """R, H, F (store.py, ``sample`` step 3): due retests, then the heap, then a fill from the pools.

    R: up to ``quota`` pooled problems last tested at least ``retest_interval`` steps ago, least
    recently tested first. H: up to B − |R| from the heap (:meth:`take_from_heap`). F: up to
    B − |R| − |H| from the pools regardless of score, in the same order as R.
    """

    def sample(self, view: SamplerView, request: SampleRequest) -> list[Pick]:
        picks = self.retests(view, request)
        picks += self.take_from_heap(view, request, request.batch_size - len(picks))
        picks += take_from_pools(view, request.batch_size - len(picks), None)
        return picks

    def retests(self, view: SamplerView, request: SampleRequest) -> list[Pick]:
        """R: the due retests, least recently tested first."""
        return take_from_pools(view, request.quota, float(request.step - request.retest_interval))

    def take_from_heap(self, view: SamplerView, request: SampleRequest, count: int) -> list[Pick]:
        """H: up to ``count`` heap problems."""
        raise NotImplementedError


class HeapSampler(RetestThenHeap):
    """``heap`` (the paper): H is the top of the heap, in heap order. Draws no random numbers."""

    def take_from_heap(self, view: SamplerView, request: SampleRequest, count: int) -> list[Pick]:
        return [view.take_heap(0) for _ in range(min(count, view.heap_size()))]


class WeightedSampler(RetestThenHeap):
    """``weighted``: each H slot draws a rank uniformly over the remaining heap and accepts it with
    probability (priority / 0.25)^alpha, at most 8 tries, else the top (so ∝ priority^alpha by
    rejection). Two draws per try: u1 for the rank, u2 for the acceptance."""

    def take_from_heap(self, view: SamplerView, request: SampleRequest, count: int) -> list[Pick]:
        rng, alpha = request.rng, self.config.alpha
        picks: list[Pick] = []
        for _ in range(count):
            size = view.heap_size()
            if size == 0:
                break
            chosen = 0  # the top, when every try is rejected
            for _try in range(8):
                rank = min(math.floor(rng.random() * size), size - 1)
                if rng.random() < (view.heap_entry(rank)[0] / MAX_PRIORITY) ** alpha:
                    chosen = rank
                    break
            picks.append(view.take_heap(chosen))
        return picks


class UniformSampler(MemorySampler):
    """``uniform`` (the baseline): each slot draws idx = ⌊u·N⌋ over the concatenation [heap in
    heap order, solved in pool order, unsolved in pool order] of the N problems not leased."""

    def sample(self, view: SamplerView, request: SampleRequest) -> list[Pick]:
        picks: list[Pick] = []
        for _ in range(request.batch_size):
            nh, ns = view.heap_size(), view.pool_size(Pool.SOLVED)
            n = nh + ns + view.pool_size(Pool.UNSOLVED)
            if n == 0:
                break
            idx = min(math.floor(request.rng.random() * n), n - 1)
            if idx < nh:
                picks.append(view.take_heap(idx))
            elif idx < nh + ns:
                picks.append(view.take_pool(Pool.SOLVED, idx - nh))
            else:
                picks.append(view.take_pool(Pool.UNSOLVED, idx - nh - ns))
        return picks


# -- the registry -----------------------------------------------------------------------------
@dataclass(frozen=True)
class SamplerSpec:
    """One sampler: its name and everything the stores and configurations need to know of it.

    Attributes:
        name: the value of ``--sampler``.
        memory: the in-process implementation.
        uses_rng: draws random numbers (the Redis store then pins the step it seeded the RNG for).
        retests: gets a retest quota (``retest_fraction`` of each batch); False: quota 0.
        lua_branch: its function in ``lua/sample.lua``; None: memory store only.
        help: one line for ``--help``.
    """

    name: str
    memory: type[MemorySampler]
    uses_rng: bool
    retests: bool
    lua_branch: str | None
    help: str


SAMPLERS: dict[str, SamplerSpec] = {s.name: s for s in (
    SamplerSpec("heap", HeapSampler, uses_rng=False, retests=True, lua_branch="heap",
                help="deterministic top-B by priority (the paper)"),
    SamplerSpec("weighted", WeightedSampler, uses_rng=True, retests=True, lua_branch="weighted",
                help="draws ∝ priority^alpha"),
    SamplerSpec("uniform", UniformSampler, uses_rng=True, retests=False, lua_branch="uniform",
                help="uniform over all problems (the baseline)"),
)}

#: The sampler names as a type, for typed settings.
SamplerName = Literal[tuple(SAMPLERS)]  # type: ignore[valid-type]
#: One line naming every sampler, for a ``--sampler`` description.
SAMPLER_HELP = "; ".join(f"{s.name}: {s.help}" for s in SAMPLERS.values())
