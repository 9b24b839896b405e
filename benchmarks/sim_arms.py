"""The simulator's arms: a sampling method is the store's sampler and settings plus the learner's
rule for the groups it is given (``benchmarks/simulate.py``, ``benchmarks/method.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prioreplay.rules import PriorityParams


@dataclass(frozen=True)
class Method:
    """A sampling method: the store's sampler and retest share, plus the learner-side filter.

    Under the synchronous learner ``dynamic_sampling`` gathers B mixed groups over generation
    batches before a step (DAPO); under the real learner's model (``sim_learner.SystemModel``)
    the trajectory queue does that for every arm, and ``dilute`` also queues the zero-variance
    groups, which a step then trains on (the server's ``--queue-zero-variance`` with the
    learner's ``--train-zero-variance``).
    """

    name: str
    label: str
    sampler: str
    retest_fraction: float
    dynamic_sampling: bool = False
    alpha: float = 1.0
    train_probes: bool = False  # mixed probe groups (fewer than G completions) go to the learner
    #: zero-variance groups stay in the step's batch and dilute it (plain GRPO as TRL runs it: the
    #: token-mean loss counts their tokens, which carry zero advantage); SimParams.dilute for all
    dilute: bool = False
    store: tuple[tuple[str, Any], ...] = ()  # further StoreConfig fields (temperature, posterior_decay...)


METHODS: tuple[Method, ...] = (
    Method("uniform", "uniform", "uniform", 0.0),
    Method("uniform_dapo", "uniform + dynamic sampling (DAPO)", "uniform", 0.0, dynamic_sampling=True),
    Method("heap_no_retest", "heap, no retest (retest_fraction=0)", "heap", 0.0),
    Method("heap", "heap + retest (the paper, retest_fraction=0.1)", "heap", 0.1),
    Method("weighted", "weighted (alpha=1) + retest 0.1", "weighted", 0.1),
)

#: The samplers beyond the paper (docs/METHOD.md, "How a default is chosen"; figures ``samplers.*``),
#: each against ``heap`` and ``uniform``.
CANDIDATES: tuple[Method, ...] = (
    Method("gumbel_t1", "Gumbel-top-k T=1 + retest 0.1", "gumbel", 0.1, store=(("gumbel_temperature", 1.0),)),
    Method("gumbel_t03", "Gumbel-top-k T=0.3 + retest 0.1", "gumbel", 0.1, store=(("gumbel_temperature", 0.3),)),
    Method("posterior_l1", "posterior retests, decay 1 (no step decay)", "posterior", 0.1, store=(("posterior_decay", 1.0),)),
    Method("posterior_l095", "posterior retests, decay 0.95/step", "posterior", 0.1, store=(("posterior_decay", 0.95),)),
    Method("posterior_l08", "posterior retests, decay 0.8/step", "posterior", 0.1, store=(("posterior_decay", 0.8),)),
    Method("thompson_l095", "Thompson retests, decay 0.95/step", "thompson", 0.1, store=(("posterior_decay", 0.95),)),
    Method("screened", "screened: probes of 2 for unseen, probes not trained", "screened", 0.1),
    Method("screened_train", "screened, mixed probes trained", "screened", 0.1, train_probes=True),
    Method("screened_pools", "screened-pools: unseen and retests probed", "screened-pools", 0.1),
    Method(
        "screened_posterior",
        "screened probes + posterior retests (0.95)",
        "screened-posterior",
        0.1,
        store=(("posterior_decay", 0.95),),
    ),
    Method(
        "knapsack",
        "knapsack: group size per problem in a budget of G per problem (≤ 4G), all groups trained",
        "knapsack",
        0.1,
        train_probes=True,
        store=(("mean_group_size", 8), ("max_group_size", 32)),
    ),
    Method("predicted", "predicted: unseen problems ranked by kNN-predicted priority (DOTS)", "predicted", 0.1),
    Method(
        "heap_versions_k1",
        "heap + retest 0.1, due 1 policy version after the last test (--retest-versions 1)",
        "heap",
        0.1,
        store=(("retest_versions", 1),),
    ),
    Method(
        "heap_versions_k4",
        "heap + retest 0.1, due 4 policy versions after the last test (--retest-versions 4)",
        "heap",
        0.1,
        store=(("retest_versions", 4),),
    ),
    Method(
        "heap_decay08",
        "heap + retest, statistics decay λ=0.8 per report",
        "heap",
        0.1,
        store=(("params", PriorityParams(decay=0.8)),),
    ),
    Method(
        "heap_decay05",
        "heap + retest, statistics decay λ=0.5 per report",
        "heap",
        0.1,
        store=(("params", PriorityParams(decay=0.5)),),
    ),
)
