"""What every sampler shares: the RNG, the retest quota, the view a sampler sees, its picks, and
the retest-then-heap frame most samplers fill in.

Standard library and :mod:`prioreplay.rules` only, so configurations stay light.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from prioreplay.errors import InvalidArgument
from prioreplay.rules import Pool, Stats

from .params import ProbeParams, SamplerParams

if TYPE_CHECKING:  # pragma: no cover
    from ..config import StoreConfig


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
        """The next 32-bit output."""
        x = self.x
        x ^= (x << 13) & self._M
        x ^= x >> 17
        x ^= (x << 5) & self._M
        self.x = x
        return x

    def random(self) -> float:
        """A float in [0, 1): next_u32() / 2³²."""
        return self.next_u32() / 4294967296.0


def retest_quota(batch_size: int, retest_fraction: float, step: int) -> int:
    """Problems of batch ``step`` (1, 2, ...) reserved for pool retests: ⌊x·s⌋ − ⌊x·(s − 1)⌋, x = f·B.

    The fraction carries its remainder from batch to batch instead of rounding each batch: over
    S batches of B the quotas sum to ⌊f·B·S⌋, so f = 0.1 at B = 2 retests one problem every fifth
    batch (10% of the problems), not one per batch (50%); for f·B ≥ 1 a batch gets ⌊f·B⌋ or
    ⌈f·B⌉. A function of the step alone, so both stores (``lua/sample.lua`` computes it from
    ``retest_rate`` = f·B with the same double arithmetic) and a restarted server agree.
    """
    if retest_fraction <= 0.0:
        return 0
    rate = batch_size * retest_fraction
    return int(math.floor(rate * step) - math.floor(rate * (step - 1)))


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
        step: the step of this batch (1 for the first).
        quota: problems reserved for pool retests (0 when the sampler does not retest).
        retest_interval: units of the pools' clock a pooled problem waits before it is due for a
            retest (batches; policy versions with ``pool_clock``).
        rng: this step's seeded RNG, or None for a sampler with ``uses_rng=False``.
        pool_clock: what the pooled problems' scores are measured in, now: None, the batch's step
            (the paper); with ``--retest-versions`` k >= 1, the current policy version (each
            pooled score is then the version of the problem's last test, and ``retest_interval``
            is k). See :attr:`pool_now`.
    """

    batch_size: int
    step: int
    quota: int
    retest_interval: int
    rng: XorShift32 | None
    pool_clock: int | None = None

    @property
    def pool_now(self) -> int:
        """The pools' clock now: :attr:`pool_clock`, or :attr:`step` when it is None. A pooled
        problem's age is ``pool_now − score``; it is due when the age is >= ``retest_interval``."""
        return self.step if self.pool_clock is None else self.pool_clock

    @property
    def seeded_rng(self) -> XorShift32:
        """:attr:`rng`, for a sampler with ``uses_rng=True`` (the store seeds it for each step).

        Raises:
            RuntimeError: no RNG was given (a sampler that draws must set ``uses_rng``).
        """
        if self.rng is None:
            raise RuntimeError("this sampler draws random numbers: register it with uses_rng=True")
        return self.rng


class SamplerView(Protocol):
    """The problems not leased, as one ``sample`` call sees them (the memory store's view)."""

    def heap_size(self) -> int:
        """Problems in the heap."""

    def heap_entry(self, rank: int) -> tuple[float, str]:
        """(priority, member) of the problem at ``rank`` in heap order (0: the top)."""

    def pool_size(self, pool: Pool) -> int:
        """Problems in the SOLVED or UNSOLVED pool."""

    def pool_entry(self, pool: Pool, index: int) -> tuple[float, str]:
        """(last tested step, or policy version with ``--retest-versions``; member) at ``index`` in
        pool order (0: least recently tested)."""

    def problem_stats(self, member: str) -> Stats:
        """The problem's decayed reward sums."""

    def completion_tokens(self, member: str) -> float | None:
        """The problem's running mean of completion tokens per completion (decayed like its
        statistics, ``lua/report.lua``); None when no report has carried token ids."""

    def problem_prompt(self, member: str) -> str:
        """The problem's prompt text (memory store only: the ``predicted`` sampler embeds it)."""

    def take_heap(self, rank: int) -> Pick:
        """Lease the heap problem at ``rank``; it leaves the view at once."""

    def take_pool(self, pool: Pool, index: int) -> Pick:
        """Lease the pooled problem at ``index``; it leaves the view at once."""


class MemorySampler:
    """A sampler's in-process implementation (the memory store runs it; the oracle for Lua).

    Args:
        config: the store configuration: the settings every sampler shares (retests, the
            statistics' prior ``config.params``, the seed).
        params: this sampler's own parameters, validated: an instance of its registry row's model
            (``SamplerSpec.params``; the stores pass ``config.sampler_params``). A sampler reads its
            parameters here (``self.params.alpha``), never from flat configuration fields.
    """

    #: The model of this sampler's parameters; a subclass narrows it to its own (``params: WeightedParams``).
    params: SamplerParams

    def __init__(self, config: StoreConfig, params: SamplerParams) -> None:
        self.config = config
        self.params = params

    def sample(self, view: SamplerView, request: SampleRequest) -> list[Pick]:
        """Take up to ``request.batch_size`` problems from ``view``; return them in batch order."""
        raise NotImplementedError


# -- pool order -------------------------------------------------------------------------------
_POOL_RANK = {Pool.SOLVED: 0, Pool.UNSOLVED: 1}


def _pool_head(view: SamplerView, pos: dict[Pool, int]) -> tuple[tuple[float, int, str], Pool] | None:
    """The first entry in merged pool order (score asc, solved before unsolved, member asc) at or
    after position ``pos[pool]`` of each pool, as ((score, pool rank, member), pool); None: none."""
    head: tuple[tuple[float, int, str], Pool] | None = None
    for pool in (Pool.SOLVED, Pool.UNSOLVED):
        if pos[pool] < view.pool_size(pool):
            score, member = view.pool_entry(pool, pos[pool])
            key = (score, _POOL_RANK[pool], member)
            if head is None or key < head[0]:
                head = (key, pool)
    return head


def take_from_pools(view: SamplerView, count: int, max_score: float | None) -> list[Pick]:
    """Up to ``count`` pooled problems in merged pool order (score asc, solved before unsolved,
    member asc), only those with score <= ``max_score`` (None: any score)."""
    picks: list[Pick] = []
    start = {Pool.SOLVED: 0, Pool.UNSOLVED: 0}
    while len(picks) < count:
        head = _pool_head(view, start)
        if head is None or (max_score is not None and head[0][0] > max_score):
            break
        picks.append(view.take_pool(head[1], 0))
    return picks


def due_window(view: SamplerView, request: SampleRequest, size: int) -> list[tuple[float, Pool, int, str]]:
    """The ``size`` least recently tested due pooled problems (score <= pool_now − interval), in
    merged pool order, as (score, pool, index in its pool, member); nothing is taken."""
    thr = float(request.pool_now - request.retest_interval)
    out: list[tuple[float, Pool, int, str]] = []
    pos = {Pool.SOLVED: 0, Pool.UNSOLVED: 0}
    while len(out) < size:
        head = _pool_head(view, pos)
        if head is None or head[0][0] > thr:
            break
        (score, _, member), pool = head
        out.append((score, pool, pos[pool], member))
        pos[pool] += 1
    return out


def take_top_of_heap(view: SamplerView, count: int) -> list[Pick]:
    """Up to ``count`` problems from the top of the heap, in heap order (draws nothing)."""
    return [view.take_heap(0) for _ in range(min(count, view.heap_size()))]


# -- the frame: retests, then the heap, then a fill ---------------------------------------------
class RetestThenHeap(MemorySampler):
    """R, H, F (store/base.py, ``sample`` step 3): due retests, then the heap, then a fill from the pools.

    R (:meth:`retests`): up to ``quota`` pooled problems last tested at least ``retest_interval``
    steps ago, least recently tested first. H (:meth:`take_from_heap`): up to B − |R| from the
    top of the heap. F: up to B − |R| − |H| from the pools regardless of score, in the same
    order as R. A sampler overrides R or H (never both through a chain of subclasses) and may
    turn on probes.
    """

    #: Probe problems never tested (statistics n == 0) with ``self.params.probe_size`` completions.
    probe_unseen = False
    #: Probe the retests R (not the fill F) with ``self.params.probe_size`` completions.
    probe_retests = False

    def sample(self, view: SamplerView, request: SampleRequest) -> list[Pick]:
        picks = self.retests(view, request)
        if self.probe_retests:
            picks = [replace(p, group_size=self.probe_size()) for p in picks]
        heap = self.take_from_heap(view, request, request.batch_size - len(picks))
        if self.probe_unseen:
            heap = [replace(p, group_size=self.probe_size()) if view.problem_stats(p.member).n == 0.0 else p for p in heap]
        picks += heap
        picks += take_from_pools(view, request.batch_size - len(picks), None)
        return picks

    def probe_size(self) -> int:
        """Completions of a probe group: ``self.params.probe_size``.

        Raises:
            InvalidArgument: the sampler probes but its parameter model is not a :class:`ProbeParams`.
        """
        if not isinstance(self.params, ProbeParams):
            raise InvalidArgument(
                f"sampler {type(self).__name__} probes, so its parameters ({type(self.params).__name__}) must "
                "subclass samplers.params.ProbeParams (probe_size)"
            )
        return self.params.probe_size

    def retests(self, view: SamplerView, request: SampleRequest) -> list[Pick]:
        """R: the due retests (score <= pool_now − retest_interval), least recently tested first."""
        return take_from_pools(view, request.quota, float(request.pool_now - request.retest_interval))

    def take_from_heap(self, view: SamplerView, request: SampleRequest, count: int) -> list[Pick]:
        """H: up to ``count`` heap problems (default: the top, in heap order)."""
        return take_top_of_heap(view, count)
