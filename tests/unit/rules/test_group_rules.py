"""Unit tests of the pure group rules (prioreplay/rules.py).

Expected values are computed by hand (fractions in the comments) or by an independent
implementation in the test (``statistics.pvariance``).
"""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prioreplay import rules
from prioreplay.errors import InvalidArgument
from prioreplay.rules import GroupKind, Pool, PriorityParams, Stats

NO_PRIOR = PriorityParams(decay=1.0)  # cumulative counts, no prior (the default decay is rules.DEFAULT_DECAY)


def stats_of(groups, params=NO_PRIOR) -> Stats:
    s = Stats()
    for g in groups:
        s = rules.update_stats(s, g, params)
    return s


# -- priority = p(1 − p) -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "rewards, expected",
    [
        ([1, 0, 0, 0], 3 / 16),  # p = 1/4: 1/4 · 3/4
        ([1, 1, 0], 2 / 9),  # p = 2/3: 2/3 · 1/3
        ([1, 0], 1 / 4),  # p = 1/2: the maximum
        ([1, 1, 1, 1, 1, 1, 1, 0], 7 / 64),  # p = 7/8
        ([1, 1, 1], 0.0),  # all correct: no gradient
        ([0, 0, 0, 0], 0.0),  # all wrong: no gradient
    ],
)
def test_priority_of_binary_group_is_p_times_one_minus_p(rewards, expected):
    assert rules.priority(stats_of([rewards]), NO_PRIOR) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_unseen_problem_gets_the_maximum_priority():
    assert rules.priority(Stats(), NO_PRIOR) == rules.MAX_PRIORITY == 0.25


@given(st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=16), min_size=1, max_size=6))
@settings(max_examples=60, deadline=None, derandomize=True)
def test_binary_priority_matches_cumulative_success_rate(groups):
    flat = [r for g in groups for r in g]
    p = sum(flat) / len(flat)
    assert rules.priority(stats_of(groups), NO_PRIOR) == pytest.approx(p * (1 - p), abs=1e-12)


def test_decay_one_is_cumulative_and_decay_zero_keeps_the_latest_group():
    groups = [[1, 1, 1, 1], [0, 0, 0, 0]]
    cumulative = PriorityParams(decay=1.0)
    latest = PriorityParams(decay=0.0)
    half = PriorityParams(decay=0.5)
    # λ = 1: 4 successes of 8, p = 1/2
    assert stats_of(groups, cumulative) == Stats(8.0, 4.0, 4.0)
    assert rules.priority(stats_of(groups, cumulative), cumulative) == 0.25
    # λ = 0: only the all-wrong group counts, p = 0
    assert stats_of(groups, latest) == Stats(4.0, 0.0, 0.0)
    assert rules.priority(stats_of(groups, latest), latest) == 0.0
    # λ = 1/2: n = 4/2 + 4 = 6, s1 = 4/2 = 2, p = 1/3, p(1 − p) = 2/9
    assert stats_of(groups, half) == Stats(6.0, 2.0, 2.0)
    assert rules.priority(stats_of(groups, half), half) == pytest.approx(2 / 9, rel=1e-12)


def test_beta_prior_acts_as_pseudo_observations():
    uniform_prior = PriorityParams(prior_alpha=1.0, prior_beta=1.0)
    # no data: m1 = 1/2 → 1/4
    assert rules.priority(Stats(), uniform_prior) == 0.25
    # 4 successes: m1 = (4 + 1)/(4 + 2) = 5/6 → 5/6 · 1/6 = 5/36 (without the prior: 0)
    s = stats_of([[1, 1, 1, 1]], uniform_prior)
    assert rules.priority(s, uniform_prior) == pytest.approx(5 / 36, rel=1e-12)
    assert rules.priority(s, NO_PRIOR) == 0.0
    # α₀ = 3, β₀ = 1, no data: m1 = 3/4 → 3/16
    assert rules.priority(Stats(), PriorityParams(prior_alpha=3.0, prior_beta=1.0)) == pytest.approx(3 / 16, rel=1e-12)


@pytest.mark.parametrize("rewards", [[0.2, 0.8], [0.1, 0.5, 0.9, 0.9], [0.3, 0.3, 0.3], [0.0, 0.25, 1.0]])
def test_non_binary_rewards_give_the_population_variance(rewards):
    expected = statistics.pvariance(rewards)
    assert rules.priority(stats_of([rewards]), NO_PRIOR) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    "rewards",
    [[], [float("nan")], [1.0, float("inf")], [-0.1], [1.0000001], [0.5, "1"], [None]],
    ids=["empty", "nan", "inf", "negative", "above-one", "string", "none"],
)
def test_invalid_rewards_are_rejected_with_the_index(rewards):
    with pytest.raises(InvalidArgument) as err:
        rules.validate_rewards(rewards, where="outcomes[3] rewards")
    assert "outcomes[3] rewards" in str(err.value)
    if rewards:
        assert f"[{len(rewards) - 1}]" in str(err.value)


def test_valid_rewards_pass():
    rules.validate_rewards([0.0, 1.0, 0.5, 1])


@pytest.mark.parametrize(
    "kwargs",
    [{"decay": 1.5}, {"decay": -0.1}, {"prior_alpha": -1.0}, {"prior_beta": float("nan")}, {"prior_alpha": float("inf")}],
)
def test_priority_params_reject_out_of_range_values(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(InvalidArgument, match=name):
        PriorityParams(**kwargs)


# -- classification and movement ---------------------------------------------------------------
@pytest.mark.parametrize(
    "rewards, kind, pool",
    [
        ([1, 0, 1], GroupKind.MIXED, Pool.HEAP),
        ([0.5, 0.4], GroupKind.MIXED, Pool.HEAP),
        ([1, 1, 1], GroupKind.ALL_CORRECT, Pool.SOLVED),
        ([0, 0], GroupKind.ALL_WRONG, Pool.UNSOLVED),
        ([0.5, 0.5], GroupKind.CONSTANT, Pool.HEAP),
        ([1.0], GroupKind.ALL_CORRECT, Pool.SOLVED),
    ],
)
def test_classify_and_destination(rewards, kind, pool):
    assert rules.classify(rewards) is kind
    assert rules.destination(kind) is pool


@pytest.mark.parametrize(
    "rewards, kind",
    [
        ([0.3] * 7 + [0.1 + 0.2], GroupKind.CONSTANT),  # 0.1 + 0.2 != 0.3 in float64 only
        ([0.35] * 8, GroupKind.CONSTANT),
        ([1.0] * 3 + [1.0 - 2**-24], GroupKind.ALL_CORRECT),  # a float32 ulp below 1, in either order
        ([1.0 - 2**-24] + [1.0] * 3, GroupKind.ALL_CORRECT),
        ([0.0, 1e-9], GroupKind.ALL_WRONG),
        ([0.3, 0.3 + 1e-4], GroupKind.MIXED),  # far above rounding: a difference the reward means
        ([50.0, 50.0 + 2e-5], GroupKind.CONSTANT),  # relative above 1
    ],
)
def test_classify_treats_rewards_equal_within_one_tolerance_in_float32_and_float64(rewards, kind):
    """One tolerance (rules.EQUAL_REWARDS_TOL) decides "all equal", whatever the precision the
    rewards went through: float64 values and their float32 roundings get the same kind."""
    import numpy as np

    assert rules.classify(rewards) is kind
    assert rules.classify([float(r) for r in np.asarray(rewards, dtype=np.float32)]) is kind


@pytest.mark.parametrize(
    "source, rewards, forgetting, breakthrough",
    [
        (Pool.SOLVED, [1, 1, 0], True, False),
        (Pool.SOLVED, [1, 1, 1], False, False),
        (Pool.SOLVED, [0.9, 1], True, False),
        (Pool.UNSOLVED, [0, 0, 1], False, True),
        (Pool.UNSOLVED, [0, 0, 0], False, False),
        (Pool.UNSOLVED, [0.1, 0], False, True),
        (Pool.HEAP, [1, 0], False, False),
        (Pool.HEAP, [0, 0], False, False),
    ],
)
def test_forgetting_and_breakthrough_need_a_pool_source(source, rewards, forgetting, breakthrough):
    assert rules.is_forgetting(source, rewards) is forgetting
    assert rules.is_breakthrough(source, rewards) is breakthrough
    # the stores' one-pass form, from the verdict they compute anyway, says the same
    verdict = rules.destination(rules.classify(rewards), rules.pass_rate(rewards))
    event = rules.retest_event(source, verdict)
    assert (event == "forgetting", event == "breakthrough") == (forgetting, breakthrough)


@pytest.mark.parametrize("decay", [1.0, 0.9, 0.5])
@pytest.mark.parametrize("rewards", [[1, 0, 1], [0.1, 0.1], [0.3, 0.7, 0.2]])
def test_fold_sums_is_update_stats_bit_for_bit(decay, rewards):
    before = rules.Stats(n=3.0, s1=1.1, s2=0.7)
    folded = rules.fold_sums(before, decay, len(rewards), *rules.reward_sums(rewards))
    assert folded == rules.update_stats(before, rewards, rules.PriorityParams(decay=decay))


# --------------------------------------------------------------------------- zero variance is exactly 0 (issue 13)


@pytest.mark.parametrize("value", [0.1, 0.2, 0.3, 1 / 3, 0.7, 0.9, 0.123456789])
@pytest.mark.parametrize("group_size", [1, 3, 7, 8, 16])
@pytest.mark.parametrize("decay", [1.0, 0.9, 0.5])
def test_constant_non_binary_rewards_have_priority_exactly_zero(value, group_size, decay):
    """m2 − m1² cancels to ±1e-17 for constant groups; a zero-variance problem must get 0."""
    params = rules.PriorityParams(decay=decay)
    stats = rules.Stats()
    for _ in range(5):
        stats = rules.update_stats(stats, [value] * group_size, params)
        assert rules.priority(stats, params) == 0.0


def test_tiny_true_variance_is_kept():
    params = rules.PriorityParams()
    stats = rules.update_stats(rules.Stats(), [1.0] + [0.0] * 9999, params)
    assert rules.priority(stats, params) == pytest.approx(1e-4 * (1 - 1e-4))


# -- pass-rate bands (--solved-at / --unsolved-at) ---------------------------------------------
@pytest.mark.parametrize(
    "rewards, bands, pool",
    [
        ([1, 1, 1, 0], rules.PoolBands(solved_at=0.75), Pool.SOLVED),  # p̂ = 0.75 >= 0.75
        ([1, 1, 0, 0], rules.PoolBands(solved_at=0.75), Pool.HEAP),
        ([1, 0, 0, 0], rules.PoolBands(unsolved_at=0.25), Pool.UNSOLVED),  # p̂ = 0.25 <= 0.25
        ([0.5, 0.5], rules.PoolBands(solved_at=0.5), Pool.SOLVED),  # a constant group too
        ([1, 1, 1, 0], rules.PAPER_BANDS, Pool.HEAP),
        ([1, 1, 1, 1], rules.PoolBands(unsolved_at=0.5), Pool.SOLVED),
        ([0, 0], rules.PoolBands(solved_at=0.5), Pool.UNSOLVED),
    ],
)
def test_bands_pool_groups_whose_pass_rate_is_at_or_past_them(rewards, bands, pool):
    assert rules.destination(rules.classify(rewards), rules.pass_rate(rewards), bands) is pool


def test_paper_bands_pool_a_group_all_correct_up_to_rounding_and_keep_a_mixed_one_in_the_heap():
    rounded = [1.0, 1.0 - 2**-53]  # the sum rounds to 2.0: p̂ = 1, and the rewards are equal within the tolerance
    assert rules.pass_rate(rounded) == 1.0
    assert rules.destination(rules.classify(rounded), rules.pass_rate(rounded)) is Pool.SOLVED
    assert not rules.is_forgetting(Pool.SOLVED, rounded)
    mixed = [1.0, 1.0 - 10 * rules.EQUAL_REWARDS_TOL]
    assert rules.destination(rules.classify(mixed), rules.pass_rate(mixed)) is Pool.HEAP
    assert rules.is_forgetting(Pool.SOLVED, mixed)


@pytest.mark.parametrize("rewards, forgetting", [([1, 1, 1, 0], False), ([1, 1, 0, 0], True), ([1, 1, 1, 1], False)])
def test_a_retest_is_forgetting_only_when_it_leaves_the_solved_band(rewards, forgetting):
    bands = rules.PoolBands(solved_at=0.75, unsolved_at=0.25)
    assert rules.is_forgetting(Pool.SOLVED, rewards, bands) is forgetting
    assert rules.is_breakthrough(Pool.UNSOLVED, [1, 0, 0, 0], bands) is False  # p̂ = 0.25 stays unsolved
    assert rules.is_breakthrough(Pool.UNSOLVED, [1, 1, 0, 0], bands) is True


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({"solved_at": 0.0}, "solved_at (0.0) must be in (0, 1]"),
        ({"unsolved_at": 1.0}, "unsolved_at (1.0) must be in [0, 1)"),
        ({"solved_at": 0.5, "unsolved_at": 0.5}, "--unsolved-at"),
        ({"solved_at": float("nan")}, "solved_at (nan)"),
    ],
)
def test_bands_refuse_out_of_range_or_overlapping_values(kwargs, text):
    with pytest.raises(InvalidArgument) as err:
        rules.PoolBands(**kwargs)
    assert text in str(err.value)


@pytest.mark.parametrize(
    "step, version, retest_versions, expected",
    [(7, 3, 0, 7.0), (7, 3, 1, 3.0), (7, 3, 5, 3.0), (7, 0, 2, 0.0)],
)
def test_pool_score_is_the_step_or_with_retest_versions_the_policy_version(step, version, retest_versions, expected):
    assert rules.pool_score(step, version, retest_versions) == expected
