"""``knapsack``: the paper's batch (retests, heap top, fill), with a per-problem group size chosen
within a fixed completion-token budget per batch (Knapsack RL). Lua branch ``knapsack``.

Its spec has ``probes=True``: only clients that declare ``accepts_group_size`` may lease from it.
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Literal

from prioreplay.rules import PriorityParams, Stats

from .base import Pick, RetestThenHeap, SampleRequest, SamplerView
from .params import SamplerParams, max_group_size_field, mean_group_size_field

#: The smallest group a pick gets: two completions are the fewest with a GRPO signal.
MIN_GROUP_SIZE = 2


def pass_rate_estimate(stats: Stats, params: PriorityParams) -> float:
    """p̂ = (s1 + α₀) / (n + α₀ + β₀), the problem's posterior-mean pass rate; 0.5 with no
    observation and no prior. Evaluated in this operation order by ``lua/sample.lua``."""
    denom = stats.n + params.prior_alpha + params.prior_beta
    if denom <= 0.0:
        return 0.5
    return (stats.s1 + params.prior_alpha) / denom


def group_signal_gain(p: float, g: int) -> float:
    """The expected-signal gain of a (g+1)-th completion for a problem of pass rate ``p``.

    The expected signal of a group of g is v(g) = p(1 − p)·(1 − p^g − (1 − p)^g): the reward
    variance times the chance that the group is mixed (a zero-variance group has no GRPO
    gradient). v(g+1) − v(g) = p(1 − p)·(p^g·(1 − p) + (1 − p)^g·p), decreasing in g, so the
    greedy allocation below is the knapsack optimum for equal costs (Knapsack RL: Li et al. 2025,
    "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget Allocation", arXiv
    2509.25849; Reinforce-Ada, arXiv 2510.04996, likewise samples a prompt until its group is
    mixed). The optimum gives the most completions to p̂ moderately off 1/2 (about 0.1–0.3 and
    0.7–0.9: a p̂ = 1/2 group is mixed soonest) and the fewest to the extremes.
    """
    q = 1.0 - p
    return p * q * (p**g * q + q**g * p)


def allocate_group_sizes(rates: list[float], costs: list[float], mean_group_size: int, max_group_size: int) -> list[int]:
    """Completions per problem, greedy by expected-signal gain per token, within the batch budget.

    Budget: mean_group_size · Σ costs tokens (what the batch costs at a fixed G = mean_group_size).
    Every problem starts at :data:`MIN_GROUP_SIZE`; then one completion at a time goes to the
    problem with the largest :func:`group_signal_gain` / cost (ties: batch order) that is under
    ``max_group_size`` and still fits the budget. Mirrored in ``lua/sample.lua`` (``knapsack_sizes``).

    Args:
        rates: p̂ of each pick, in batch order.
        costs: expected completion tokens of each pick (> 0), in batch order.
        mean_group_size: Ḡ >= MIN_GROUP_SIZE, the budget's completions per problem.
        max_group_size: the largest group a problem gets (>= mean_group_size).

    Returns:
        The group size of each pick, in batch order (each in [MIN_GROUP_SIZE, max_group_size]).
    """
    sizes = [MIN_GROUP_SIZE] * len(rates)
    budget = mean_group_size * sum(costs)
    spent = MIN_GROUP_SIZE * sum(costs)
    frontier = [(-group_signal_gain(p, MIN_GROUP_SIZE) / c, i) for i, (p, c) in enumerate(zip(rates, costs, strict=True))]
    heapq.heapify(frontier)
    while frontier:
        _, i = heapq.heappop(frontier)
        if spent + costs[i] > budget:
            continue  # never fits again: spent only grows
        sizes[i] += 1
        spent += costs[i]
        if sizes[i] < max_group_size:
            heapq.heappush(frontier, (-group_signal_gain(rates[i], sizes[i]) / costs[i], i))
    return sizes


def pick_costs(view: SamplerView, picks: list[Pick]) -> list[float]:
    """Expected completion tokens of each pick: its running mean, else the mean of the picks that
    have one, else 1 (all equal: the budget counts completions). Same rule in ``lua/sample.lua``."""
    known = [view.completion_tokens(p.member) for p in picks]
    have = [t for t in known if t is not None and t > 0.0]
    fallback = sum(have) / len(have) if have else 1.0
    return [t if t is not None and t > 0.0 else fallback for t in known]


class KnapsackSampler(RetestThenHeap):
    """``knapsack``: R, H, F as ``heap``; then each pick's group size by
    :func:`allocate_group_sizes` over p̂ (:func:`pass_rate_estimate`) and expected completion tokens
    (:func:`pick_costs`), with Ḡ = ``self.params.mean_group_size`` and cap ``self.params.max_group_size``."""

    params: KnapsackParams

    def sample(self, view: SamplerView, request: SampleRequest) -> list[Pick]:
        picks = super().sample(view, request)
        if not picks:
            return picks
        c = self.params
        rates = [pass_rate_estimate(view.problem_stats(p.member), self.config.params) for p in picks]
        sizes = allocate_group_sizes(rates, pick_costs(view, picks), c.mean_group_size, c.max_group_size)
        return [replace(p, group_size=g) for p, g in zip(picks, sizes, strict=True)]


class KnapsackParams(SamplerParams):
    """Parameters of ``knapsack``: ``mean_group_size``, ``max_group_size``."""

    name: Literal["knapsack"] = "knapsack"
    mean_group_size: int = mean_group_size_field()
    max_group_size: int = max_group_size_field()
