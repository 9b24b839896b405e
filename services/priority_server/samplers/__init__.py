"""Imports as prioreplay.priority_server.samplers: the sampler seam. Every sampler is named once,
here (the registry), with its in-process implementation and its Lua branch. Configurations
import the names from this module (:data:`SamplerName`).

A sampler decides which problems one ``sample`` call leases. Each sampler is one module of this
package (``heap.py``, ``weighted.py``, ...; what they share is in ``base.py``) with its own test
(``tests/unit/samplers/test_sampler_<name>.py``). Adding one touches its module (the memory twin
and its parameter model, :mod:`.params`), its Lua file ``store/redis/lua/samplers/<name>.lua``
(when the Redis store should run it), a row of :data:`SAMPLERS` here and its test, nothing else
(docs/SAMPLERS.md, proved by tests/system/samplers/test_sampler_recipe.py): both stores, the servicer and
every configuration (``prioreplay server --sampler``, ``prioreplay demo --sampler``, :class:`StoreConfig`) pick the
new name up from :data:`SAMPLERS`.

What a sampler gets
    * a :class:`SamplerView` of the problems not leased: the heap in heap order (priority desc,
      tie-break member desc; rank 0 is the top), each pool in pool order (last tested step asc, or
      policy version with ``retest_versions``; member asc; index 0 is the least recently tested),
      each problem's statistics
      (:class:`prioreplay.rules.Stats`: decayed n, Σr, Σr²), and ``take_*`` methods that lease a
      problem and remove it from the view at once (later draws of the same call see the rest);
    * a :class:`SampleRequest`: the batch size B, the batch's step (the global step the pools'
      scores are measured in), the retest quota (``retest_quota(B, f, step)``, 0 for samplers with
      ``retests=False``), the retest interval, and the seeded RNG of this step (a
      :class:`XorShift32` seeded with ``step_seed(seed, step)``, None for samplers with
      ``uses_rng=False``: derived from the step, so a restarted server draws the same);
    * its own parameters from :class:`StoreConfig` (given to the constructor).

What it returns
    The :class:`Pick` of every problem it took, in batch order. A pick may set ``group_size``:
    how many completions the worker should generate for that problem (None: the worker's own G).

Samplers beyond the paper (docs/METHOD.md, "How a default is chosen"; formulas in
:func:`~.posterior.posterior_variance`, :class:`~.gumbel.GumbelHeap`)
    * ``gumbel``: H is a Gumbel-top-k draw over the top of the heap (stochastic top-k).
    * ``posterior``: R scores the oldest due pooled problems by their step-decayed Beta posterior
      (MoPPS) and retests the most uncertain ones; ``thompson`` draws instead (memory store only).
    * ``screened``: the paper's heap, but a problem never tested is first probed with
      ``probe_size`` completions (SPEED-RL); ``screened-pools`` probes the retests too;
      ``screened-posterior`` combines the probes with posterior retests.
    * ``cost-aware``: H by expected signal per generated token, p(1 − p) / E[completion tokens]
      (Knapsack RL), over the top of the heap; E[tokens] is a per-problem running mean the
      stores keep from the reports' token ids.
    * ``knapsack``: the paper's batch, with a group size per problem chosen greedily within a
      fixed completion-token budget by the gain in expected signal per token (Knapsack RL,
      Reinforce-Ada); the extremes of p̂ get the fewest completions.
    * ``predicted``: problems never tested ranked by a priority predicted from their tested
      neighbours (kNN over hashed character n-gram prompt embeddings; DOTS). Memory store only.

The Redis store runs the sampler's Lua branch (``lua_branch``, its file
``store/redis/lua/samplers/<name>.lua``, put into ``sample.lua``; the parameters arrive as one JSON
argument, :meth:`SamplerSpec.lua_args`) inside one script call, with the same RNG draws in the
same order; the differential test checks that both stores lease the same problems. A sampler
without a Lua branch (None) runs in the memory store only; the Redis store refuses it at
construction.

This package imports only the standard library, pydantic (the parameter models),
:mod:`prioreplay.errors` and :mod:`prioreplay.rules`, so configurations
(and ``prioreplay --help``) stay light.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from prioreplay.errors import InvalidArgument

from .base import (
    MemorySampler,
    Pick,
    RetestThenHeap,
    SampleRequest,
    SamplerView,
    XorShift32,
    due_window,
    retest_quota,
    step_seed,
    take_from_pools,
    take_top_of_heap,
)
from .cost_aware import CostAwareHeap, CostAwareParams
from .gumbel import GumbelHeap, GumbelParams
from .heap import HeapParams, HeapSampler
from .knapsack import KnapsackParams, KnapsackSampler, allocate_group_sizes
from .params import SamplerParams
from .posterior import PosteriorParams, PosteriorSampler, posterior_retests, posterior_variance
from .predicted import PredictedParams, PredictedPriority
from .screened import ScreenedParams, ScreenedSampler
from .screened_pools import ScreenedPoolsParams, ScreenedPoolsSampler
from .screened_posterior import ScreenedPosteriorParams, ScreenedPosteriorSampler
from .thompson import ThompsonParams, ThompsonSampler
from .uniform import UniformParams, UniformSampler
from .weighted import WeightedParams, WeightedSampler

__all__ = [
    "DEFAULT_SAMPLER",
    "SAMPLERS",
    "SAMPLER_HELP",
    "CostAwareHeap",
    "GumbelHeap",
    "HeapSampler",
    "KnapsackSampler",
    "MemorySampler",
    "Pick",
    "PosteriorSampler",
    "PredictedPriority",
    "RetestThenHeap",
    "SampleRequest",
    "SamplerName",
    "SamplerParams",
    "SamplerSpec",
    "SamplerView",
    "ScreenedPoolsSampler",
    "ScreenedPosteriorSampler",
    "ScreenedSampler",
    "ThompsonSampler",
    "UniformSampler",
    "WeightedSampler",
    "XorShift32",
    "allocate_group_sizes",
    "due_window",
    "posterior_retests",
    "posterior_variance",
    "retest_quota",
    "step_seed",
    "take_from_pools",
    "take_top_of_heap",
]


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
        probes: may ask for another number of completions than the worker's G
            (``Pick.group_size``): only clients that declare ``accepts_group_size`` may lease from it.
    """

    name: str
    memory: type[MemorySampler]
    uses_rng: bool
    retests: bool
    lua_branch: str | None
    help: str
    probes: bool = False
    #: Its parameters' model (its module's ``<Name>Params``): defaults, bounds, the JSON sent to Lua.
    params: type[SamplerParams] = SamplerParams

    def lua_args(self, params: SamplerParams) -> dict[str, Any]:
        """The JSON argument ``sampler`` of ``sample.lua``: ``name`` (the branch), the sampler's
        parameters (``params``, a :attr:`params` instance), and the probe flags of its memory twin.

        Raises:
            InvalidArgument: ``params`` is not this sampler's model.
        """
        if type(params) is not self.params:
            raise InvalidArgument(f"sampler {self.name!r} takes {self.params.__name__}, not {type(params).__name__}")
        out: dict[str, Any] = {**params.model_dump(exclude={"name"}), "name": self.lua_branch}
        out["probe_unseen"] = bool(getattr(self.memory, "probe_unseen", False))
        out["probe_retests"] = bool(getattr(self.memory, "probe_retests", False))
        return out


SAMPLERS: dict[str, SamplerSpec] = {
    s.name: s
    for s in (
        SamplerSpec(
            "heap",
            HeapSampler,
            params=HeapParams,
            uses_rng=False,
            retests=True,
            lua_branch="heap",
            help="deterministic top-B by priority (the paper)",
        ),
        SamplerSpec(
            "weighted",
            WeightedSampler,
            params=WeightedParams,
            uses_rng=True,
            retests=True,
            lua_branch="weighted",
            help="draws ∝ priority^alpha",
        ),
        SamplerSpec(
            "uniform",
            UniformSampler,
            params=UniformParams,
            uses_rng=True,
            retests=False,
            lua_branch="uniform",
            help="uniform over all problems (the baseline)",
        ),
        SamplerSpec(
            "gumbel",
            GumbelHeap,
            params=GumbelParams,
            uses_rng=True,
            retests=True,
            lua_branch="gumbel",
            help="Gumbel-top-k over the top 4B of the heap, temperature T",
        ),
        SamplerSpec(
            "posterior",
            PosteriorSampler,
            params=PosteriorParams,
            uses_rng=False,
            retests=True,
            lua_branch="posterior",
            help="heap top; retests by the step-decayed Beta posterior (MoPPS)",
        ),
        SamplerSpec(
            "thompson",
            ThompsonSampler,
            params=ThompsonParams,
            uses_rng=True,
            retests=True,
            lua_branch=None,
            help="heap top; retests by Thompson draws of the decayed posterior (memory store only)",
        ),
        SamplerSpec(
            "screened",
            ScreenedSampler,
            params=ScreenedParams,
            uses_rng=False,
            retests=True,
            lua_branch="screened",
            help="heap + retests; problems never tested are probed with probe_size completions first",
            probes=True,
        ),
        SamplerSpec(
            "screened-pools",
            ScreenedPoolsSampler,
            params=ScreenedPoolsParams,
            uses_rng=False,
            retests=True,
            lua_branch="screened-pools",
            help="screened, and retests are probes too",
            probes=True,
        ),
        SamplerSpec(
            "screened-posterior",
            ScreenedPosteriorSampler,
            params=ScreenedPosteriorParams,
            uses_rng=False,
            retests=True,
            lua_branch="screened-posterior",
            help="screened probes + posterior retests",
            probes=True,
        ),
        SamplerSpec(
            "cost-aware",
            CostAwareHeap,
            params=CostAwareParams,
            uses_rng=False,
            retests=True,
            lua_branch="cost-aware",
            help="heap + retests; H by priority / mean completion tokens over the top 4B (Knapsack RL)",
        ),
        SamplerSpec(
            "knapsack",
            KnapsackSampler,
            params=KnapsackParams,
            uses_rng=False,
            retests=True,
            lua_branch="knapsack",
            help="heap + retests; group size per problem by expected signal per token, budget mean_group_size x E[tokens] each",
            probes=True,
        ),
        SamplerSpec(
            "predicted",
            PredictedPriority,
            params=PredictedParams,
            uses_rng=False,
            retests=True,
            lua_branch=None,
            help="heap + retests; unseen problems ranked by a kNN-predicted priority (DOTS; memory store only)",
        ),
    )
}

#: The sampler every configuration starts from (chosen by the simulator, docs/METHOD.md, "How a default is chosen";
#: ``heap``, the paper's rule, stays available by name and is the reference of every figure).
DEFAULT_SAMPLER = "heap"

#: The sampler names as a type, for typed settings.
#: A static checker cannot read a Literal built at run time from the registry, so it sees ``str``.
if TYPE_CHECKING:
    SamplerName = str
else:
    SamplerName = Literal[tuple(SAMPLERS)]
#: One line naming every sampler, for a ``--sampler`` description.
SAMPLER_HELP = "; ".join(f"{s.name}: {s.help}" for s in SAMPLERS.values())
