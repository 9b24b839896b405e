"""``knapsack`` (samplers/knapsack.py): a group size per problem within a fixed token budget."""

from __future__ import annotations

import itertools

import pytest

from prioreplay.errors import InvalidArgument
from prioreplay.priority_server.samplers.knapsack import MIN_GROUP_SIZE, allocate_group_sizes, group_signal_gain
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.records import GroupOutcome


def _signal(p: float, g: int) -> float:
    """v(g) = p(1 − p)(1 − p^g − (1 − p)^g), written independently of the module."""
    return p * (1 - p) * (1 - p**g - (1 - p) ** g)


def test_gain_is_the_difference_of_the_expected_signal_and_decreases():
    for p in (0.1, 0.5, 0.8):
        gains = [group_signal_gain(p, g) for g in range(2, 12)]
        assert gains == pytest.approx([_signal(p, g + 1) - _signal(p, g) for g in range(2, 12)], rel=1e-12)
        assert all(a > b for a, b in itertools.pairwise(gains))


def test_allocation_spends_the_budget_and_is_the_brute_force_optimum_for_equal_costs():
    rates = [0.5, 0.05, 0.3, 0.95]
    sizes = allocate_group_sizes(rates, [1.0] * 4, mean_group_size=6, max_group_size=12)
    assert sum(sizes) == 24 and all(MIN_GROUP_SIZE <= g <= 12 for g in sizes)
    best = max(
        (c for c in itertools.product(range(2, 13), repeat=4) if sum(c) == 24),
        key=lambda c: sum(_signal(p, g) for p, g in zip(rates, c, strict=True)),
    )
    assert sum(map(_signal, rates, sizes)) == pytest.approx(sum(map(_signal, rates, best)), rel=1e-12)
    # the extremes get the fewest; p̂ = 0.3 more than 0.5: a group of p̂ = 1/2 is mixed soonest
    assert sizes == [7, 3, 10, 4]


def test_a_costly_problem_gets_fewer_completions_and_the_token_budget_holds():
    costs = [100.0, 400.0]
    sizes = allocate_group_sizes([0.5, 0.5], costs, mean_group_size=8, max_group_size=64)
    assert sizes[0] > sizes[1]
    assert sum(g * c for g, c in zip(sizes, costs, strict=True)) <= 8 * sum(costs)


async def test_knapsack_leases_sizes_by_pass_rate_and_token_mean(make_store):
    store = await make_store("knapsack", n=4, retest_fraction=0.0, mean_group_size=4, max_group_size=16)
    lease = await store.sample(4)
    assert [sp.group_size for sp in lease.problems] == [4, 4, 4, 4]  # all unseen: p̂ = 0.5, equal costs
    ids = [sp.problem.id for sp in lease.problems]
    groups = [(1.0, 0.0, 1.0, 0.0), (1.0, 1.0, 1.0, 0.0), (0.0, 0.0, 0.0, 1.0), (0.0, 1.0, 1.0, 0.0)]
    tokens = [400, 400, 400, 4000]  # the last problem's completions are ten times as long
    await store.report(lease.lease_id, [GroupOutcome(i, g, b"", t) for i, g, t in zip(ids, groups, tokens, strict=True)])
    sizes = {sp.problem.id: sp.group_size for sp in (await store.sample(4)).problems}
    assert sizes[ids[1]] == sizes[ids[2]] > sizes[ids[0]]  # p̂ = 3/4 and 1/4 alike, more than 1/2
    assert MIN_GROUP_SIZE <= sizes[ids[3]] < sizes[ids[0]]  # p̂ = 1/2 too, but ten times the tokens per completion
    assert sum(sizes[i] * t / 4 for i, t in zip(ids, tokens, strict=True)) <= 4 * sum(t / 4 for t in tokens)


def test_max_group_size_below_the_mean_is_refused():
    with pytest.raises(InvalidArgument, match=r"max_group_size \(4\) must be >= mean_group_size \(8\)"):
        StoreConfig(sampler="knapsack", mean_group_size=8, max_group_size=4)
