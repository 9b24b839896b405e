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

Samplers beyond the paper (docs/BENCHMARKS.md part 2b; formulas in :func:`posterior_variance`, :class:`GumbelHeap`)
    * ``gumbel``: H is a Gumbel-top-k draw over the top of the heap (stochastic top-k).
    * ``posterior``: R scores the oldest due pooled problems by their step-decayed Beta posterior
      (MoPPS) and retests the most uncertain ones; ``thompson`` draws instead (memory store only).
    * ``screened``: the paper's heap, but a problem never tested is first probed with
      ``probe_size`` completions (SPEED-RL); ``screened-pools`` probes the retests too;
      ``screened-posterior`` combines the probes with posterior retests.

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
import random
from dataclasses import dataclass, replace
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

    #: Probe problems never tested (statistics n == 0) with ``config.probe_size`` completions.
    probe_unseen = False
    #: Probe the retests R (not the fill F) with ``config.probe_size`` completions.
    probe_retests = False

    def sample(self, view: SamplerView, request: SampleRequest) -> list[Pick]:
        picks = self.retests(view, request)
        if self.probe_retests:
            picks = [replace(p, group_size=self.config.probe_size) for p in picks]
        heap = self.take_from_heap(view, request, request.batch_size - len(picks))
        if self.probe_unseen:
            heap = [replace(p, group_size=self.config.probe_size) if view.problem_stats(p.member).n == 0.0 else p
                    for p in heap]
        picks += heap
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


def posterior_variance(stats: Stats, age: float, decay: float, prior: float) -> float:
    """Expected reward variance of a problem under its step-decayed Beta posterior.

    The evidence decays with the global steps since the problem was last tested (MoPPS: Qu et
    al. 2025, "Can Prompt Difficulty be Online Predicted for Accelerating RL Finetuning of
    Reasoning Models?", arXiv 2507.04632, a discounted Beta posterior per prompt):
    w = decay^age, a = prior + w·s1, b = prior + w·(n − s1), and for p ~ Beta(a, b)
    E[p(1 − p)] = a·b / ((a + b)·(a + b + 1)).

    Evaluated in exactly this operation order by ``lua/sample.lua`` (``posterior_variance``).

    Args:
        stats: the problem's (report-decayed) sums; s1 counts successes for binary rewards.
        age: steps since it was last tested (>= 0).
        decay: per-step evidence decay in (0, 1] (1: no decay between tests).
        prior: α₀ = β₀ > 0, the symmetric Beta prior.

    Returns:
        A float in (0, 0.25).
    """
    w = decay ** age
    a = prior + w * stats.s1
    b = prior + w * (stats.n - stats.s1)
    t = a + b
    return a * b / (t * (t + 1.0))


def due_window(view: SamplerView, request: SampleRequest, size: int) -> list[tuple[float, Pool, int, str]]:
    """The ``size`` least recently tested due pooled problems (score <= step − interval), in merged
    pool order, as (score, pool, index in its pool, member); nothing is taken."""
    thr = float(request.step - request.retest_interval)
    out: list[tuple[float, Pool, int, str]] = []
    pos = {Pool.SOLVED: 0, Pool.UNSOLVED: 0}
    while len(out) < size:
        head: tuple[tuple[float, int, str], Pool] | None = None
        for pool in (Pool.SOLVED, Pool.UNSOLVED):
            if pos[pool] < view.pool_size(pool):
                score, member = view.pool_entry(pool, pos[pool])
                key = (score, _POOL_RANK[pool], member)
                if head is None or key < head[0]:
                    head = (key, pool)
        if head is None or head[0][0] > thr:
            break
        (score, _, member), pool = head
        out.append((score, pool, pos[pool], member))
        pos[pool] += 1
    return out


def take_chosen(view: SamplerView, chosen: list[tuple[float, Pool, int, str]]) -> list[Pick]:
    """Lease the window entries ``chosen`` (in that batch order): popped from the highest pool
    index down, so the indices of the others stay valid."""
    picks: dict[str, Pick] = {}
    for _, pool, index, member in sorted(chosen, key=lambda c: c[2], reverse=True):
        picks[member] = view.take_pool(pool, index)
    return [picks[c[3]] for c in chosen]


class PosteriorRetests(RetestThenHeap):
    """R by the decayed posterior (``posterior``): the window is the ``4·quota`` least recently
    tested due pooled problems; its first (the oldest) is always retested, which bounds
    starvation (a due problem at position i of the merged pool order is retested within i + 1
    batches); the other quota − 1 slots go to the window's highest :func:`posterior_variance`
    (ties: pool order). Batch order: the oldest, then by that score descending."""

    def score(self, view: SamplerView, request: SampleRequest, entry: tuple[float, Pool, int, str]) -> float:
        c = self.config
        return posterior_variance(view.problem_stats(entry[3]), request.step - entry[0], c.posterior_decay,
                                  c.posterior_prior)

    def retests(self, view: SamplerView, request: SampleRequest) -> list[Pick]:
        if request.quota <= 0:
            return []
        window = due_window(view, request, 4 * request.quota)
        if not window:
            return []
        scored = [(self.score(view, request, e), i) for i, e in enumerate(window[1:], start=1)]
        scored.sort(key=lambda t: (-t[0], t[1]))
        chosen = [window[0]] + [window[i] for _, i in scored[:request.quota - 1]]
        return take_chosen(view, chosen)


class ThompsonRetests(PosteriorRetests):
    """``thompson``: as ``posterior``, but each window problem's score is p(1 − p) for one draw
    p ~ Beta(a, b) of its decayed posterior (Thompson sampling, as in MoPPS). The Beta draws use
    Python's ``random.Random`` seeded from this step's RNG: memory store only."""

    def retests(self, view: SamplerView, request: SampleRequest) -> list[Pick]:
        self._draw = random.Random(request.rng.next_u32()) if request.quota > 0 else None
        return super().retests(view, request)

    def score(self, view: SamplerView, request: SampleRequest, entry: tuple[float, Pool, int, str]) -> float:
        c = self.config
        st = view.problem_stats(entry[3])
        w = c.posterior_decay ** (request.step - entry[0])
        p = self._draw.betavariate(c.posterior_prior + w * st.s1, c.posterior_prior + w * (st.n - st.s1))
        return p * (1.0 - p)


class GumbelHeap(RetestThenHeap):
    """``gumbel``: H is a Gumbel-top-k draw (Kool et al. 2019, "Stochastic Beams and Where to Find
    Them", arXiv 1903.06059) over the window of the top ``4·count`` of the heap: each window
    problem at rank i gets key_i = log(max(priority_i, 1e-12)) / T − log(−log(u_i)) with
    u_i = max(rng.random(), 2⁻³²) drawn in rank order; the ``count`` largest keys are taken, in key
    order (ties: rank). This samples without replacement ∝ priority^(1/T) within the window, so a
    mixed problem of lower priority is still served; T = ``config.temperature``."""

    def take_from_heap(self, view: SamplerView, request: SampleRequest, count: int) -> list[Pick]:
        size = min(4 * count, view.heap_size())
        if size <= 0 or count <= 0:
            return []
        t = self.config.temperature
        keys = []
        for rank in range(size):
            u = max(request.rng.random(), 2.0 ** -32)
            prio = view.heap_entry(rank)[0]
            keys.append((math.log(max(prio, 1e-12)) / t - math.log(-math.log(u)), rank))
        keys.sort(key=lambda k: (-k[0], k[1]))
        chosen = [rank for _, rank in keys[:count]]
        taken: dict[int, Pick] = {}
        for rank in sorted(chosen, reverse=True):  # highest rank first: the lower ranks stay valid
            taken[rank] = view.take_heap(rank)
        return [taken[rank] for rank in chosen]


class ScreenedSampler(HeapSampler):
    """``screened``: the paper's heap + retests, with problems never tested probed first
    (SPEED-RL: Zhang et al. 2025, "SPEED-RL: Faster Training of Reasoning Models via Online
    Curriculum Learning", arXiv 2506.09016, screening rollouts). A probe group of ``probe_size``
    completions updates the statistics like any report; all-correct / all-wrong probes go to the
    pools, a mixed probe stays at the top of the heap, so a full group follows only there."""

    probe_unseen = True


class ScreenedPoolsSampler(ScreenedSampler):
    """``screened-pools``: ``screened``, and the retests are probes too."""

    probe_retests = True


class ScreenedPosteriorSampler(PosteriorRetests):
    """``screened-posterior``: probes of problems never tested, the heap's top, posterior retests."""

    probe_unseen = True

    def take_from_heap(self, view: SamplerView, request: SampleRequest, count: int) -> list[Pick]:
        return HeapSampler.take_from_heap(self, view, request, count)


class PosteriorSampler(PosteriorRetests):
    """``posterior``: the heap's top, retests by the decayed posterior."""

    def take_from_heap(self, view: SamplerView, request: SampleRequest, count: int) -> list[Pick]:
        return HeapSampler.take_from_heap(self, view, request, count)


class ThompsonSampler(ThompsonRetests):
    """``thompson``: the heap's top, retests by Thompson draws of the decayed posterior."""

    def take_from_heap(self, view: SamplerView, request: SampleRequest, count: int) -> list[Pick]:
        return HeapSampler.take_from_heap(self, view, request, count)


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
        probes: may ask for fewer completions than the worker's G (``Pick.group_size``): only
            clients that declare ``accepts_group_size`` may lease from it.
    """

    name: str
    memory: type[MemorySampler]
    uses_rng: bool
    retests: bool
    lua_branch: str | None
    help: str
    probes: bool = False


SAMPLERS: dict[str, SamplerSpec] = {s.name: s for s in (
    SamplerSpec("heap", HeapSampler, uses_rng=False, retests=True, lua_branch="heap",
                help="deterministic top-B by priority (the paper)"),
    SamplerSpec("weighted", WeightedSampler, uses_rng=True, retests=True, lua_branch="weighted",
                help="draws ∝ priority^alpha"),
    SamplerSpec("uniform", UniformSampler, uses_rng=True, retests=False, lua_branch="uniform",
                help="uniform over all problems (the baseline)"),
    SamplerSpec("gumbel", GumbelHeap, uses_rng=True, retests=True, lua_branch="gumbel",
                help="Gumbel-top-k over the top 4B of the heap, temperature T"),
    SamplerSpec("posterior", PosteriorSampler, uses_rng=False, retests=True, lua_branch="posterior",
                help="heap top; retests by the step-decayed Beta posterior (MoPPS)"),
    SamplerSpec("thompson", ThompsonSampler, uses_rng=True, retests=True, lua_branch=None,
                help="heap top; retests by Thompson draws of the decayed posterior (memory store only)"),
    SamplerSpec("screened", ScreenedSampler, uses_rng=False, retests=True, lua_branch="screened",
                help="heap + retests; problems never tested are probed with probe_size completions first",
                probes=True),
    SamplerSpec("screened-pools", ScreenedPoolsSampler, uses_rng=False, retests=True, lua_branch="screened-pools",
                help="screened, and retests are probes too", probes=True),
    SamplerSpec("screened-posterior", ScreenedPosteriorSampler, uses_rng=False, retests=True,
                lua_branch="screened-posterior", help="screened probes + posterior retests", probes=True),
)}

#: The sampler every configuration starts from (chosen by the simulator, docs/BENCHMARKS.md part 2b;
#: ``heap``, the paper's rule, stays available by name and is the reference of every figure).
DEFAULT_SAMPLER = "heap"
#: The statistics' decay λ per report (``rules.PriorityParams.decay``) a server starts from: 0.5 by
#: the simulator (docs/BENCHMARKS.md part 2b: never worse than λ = 1, 1–3% fewer rollouts under
#: forgetting and dilution). λ = 1 (cumulative counts) is the paper's rule: ``--decay 1``.
DEFAULT_DECAY = 0.5

#: The sampler names as a type, for typed settings.
SamplerName = Literal[tuple(SAMPLERS)]  # type: ignore[valid-type]
#: One line naming every sampler, for a ``--sampler`` description.
SAMPLER_HELP = "; ".join(f"{s.name}: {s.help}" for s in SAMPLERS.values())
