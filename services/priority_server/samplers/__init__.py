"""Imports as prioreplay.priority_server.samplers: the sampler seam. Every sampler is named once,
here (the registry), with its in-process implementation and its Lua branch. Configurations
import the names from this module (:data:`SamplerName`).

A sampler decides which problems one ``sample`` call leases. Each sampler is one module of this
package (``heap.py``, ``weighted.py``, ...; what they share is in ``base.py``) with its own test
(``tests/unit/samplers/test_sampler_<name>.py``). Adding one touches its module, a row of
:data:`SAMPLERS` here, its branch in ``lua/sample.lua`` (when the Redis store should run it) and
its test, nothing else: both stores, the servicer and every configuration
(``prioreplay server --sampler``, ``prioreplay demo --sampler``, :class:`StoreConfig`) pick the
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

The Redis store runs the sampler's Lua branch (``lua_branch``, a function in ``sample.lua``)
inside one script call, with the same RNG draws in the same order; the differential test checks
that both stores lease the same problems. A sampler without a Lua branch (None) runs in the
memory store only; the Redis store refuses it at construction.

This package imports only the standard library and :mod:`prioreplay.rules`, so configurations
(and ``prioreplay --help``) stay light.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from prioreplay.priority_server.samplers.base import (
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
from prioreplay.priority_server.samplers.cost_aware import CostAwareHeap
from prioreplay.priority_server.samplers.gumbel import GumbelHeap
from prioreplay.priority_server.samplers.heap import HeapSampler
from prioreplay.priority_server.samplers.knapsack import KnapsackSampler, allocate_group_sizes
from prioreplay.priority_server.samplers.posterior import PosteriorSampler, posterior_retests, posterior_variance
from prioreplay.priority_server.samplers.predicted import PredictedPriority
from prioreplay.priority_server.samplers.screened import ScreenedSampler
from prioreplay.priority_server.samplers.screened_pools import ScreenedPoolsSampler
from prioreplay.priority_server.samplers.screened_posterior import ScreenedPosteriorSampler
from prioreplay.priority_server.samplers.thompson import ThompsonSampler
from prioreplay.priority_server.samplers.uniform import UniformSampler
from prioreplay.priority_server.samplers.weighted import WeightedSampler

__all__ = [
    "DEFAULT_DECAY",
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


SAMPLERS: dict[str, SamplerSpec] = {
    s.name: s
    for s in (
        SamplerSpec(
            "heap",
            HeapSampler,
            uses_rng=False,
            retests=True,
            lua_branch="heap",
            help="deterministic top-B by priority (the paper)",
        ),
        SamplerSpec(
            "weighted", WeightedSampler, uses_rng=True, retests=True, lua_branch="weighted", help="draws ∝ priority^alpha"
        ),
        SamplerSpec(
            "uniform",
            UniformSampler,
            uses_rng=True,
            retests=False,
            lua_branch="uniform",
            help="uniform over all problems (the baseline)",
        ),
        SamplerSpec(
            "gumbel",
            GumbelHeap,
            uses_rng=True,
            retests=True,
            lua_branch="gumbel",
            help="Gumbel-top-k over the top 4B of the heap, temperature T",
        ),
        SamplerSpec(
            "posterior",
            PosteriorSampler,
            uses_rng=False,
            retests=True,
            lua_branch="posterior",
            help="heap top; retests by the step-decayed Beta posterior (MoPPS)",
        ),
        SamplerSpec(
            "thompson",
            ThompsonSampler,
            uses_rng=True,
            retests=True,
            lua_branch=None,
            help="heap top; retests by Thompson draws of the decayed posterior (memory store only)",
        ),
        SamplerSpec(
            "screened",
            ScreenedSampler,
            uses_rng=False,
            retests=True,
            lua_branch="screened",
            help="heap + retests; problems never tested are probed with probe_size completions first",
            probes=True,
        ),
        SamplerSpec(
            "screened-pools",
            ScreenedPoolsSampler,
            uses_rng=False,
            retests=True,
            lua_branch="screened-pools",
            help="screened, and retests are probes too",
            probes=True,
        ),
        SamplerSpec(
            "screened-posterior",
            ScreenedPosteriorSampler,
            uses_rng=False,
            retests=True,
            lua_branch="screened-posterior",
            help="screened probes + posterior retests",
            probes=True,
        ),
        SamplerSpec(
            "cost-aware",
            CostAwareHeap,
            uses_rng=False,
            retests=True,
            lua_branch="cost-aware",
            help="heap + retests; H by priority / mean completion tokens over the top 4B (Knapsack RL)",
        ),
        SamplerSpec(
            "knapsack",
            KnapsackSampler,
            uses_rng=False,
            retests=True,
            lua_branch="knapsack",
            help="heap + retests; group size per problem by expected signal per token, budget mean_group_size x E[tokens] each",
            probes=True,
        ),
        SamplerSpec(
            "predicted",
            PredictedPriority,
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
#: The statistics' decay λ per report (``rules.PriorityParams.decay``) a server starts from: 0.5 by
#: the simulator (docs/METHOD.md, "How a default is chosen": never worse than λ = 1, 1–3% fewer rollouts under
#: forgetting and dilution). λ = 1 (cumulative counts) is the paper's rule: ``--decay 1``.
DEFAULT_DECAY = 0.5

#: The sampler names as a type, for typed settings.
#: A static checker cannot read a Literal built at run time from the registry, so it sees ``str``.
if TYPE_CHECKING:
    SamplerName = str
else:
    SamplerName = Literal[tuple(SAMPLERS)]
#: One line naming every sampler, for a ``--sampler`` description.
SAMPLER_HELP = "; ".join(f"{s.name}: {s.help}" for s in SAMPLERS.values())
