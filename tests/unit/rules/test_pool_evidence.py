"""Pools from evidence and statistics that age (prioreplay.rules): k by G, runs of verdicts, the
pending priority and the age factor."""

from __future__ import annotations

import math

import pytest

from prioreplay import rules
from prioreplay.errors import InvalidArgument
from prioreplay.rules import Pool


@pytest.mark.parametrize(("g", "k"), [(1, 1), (2, 2), (3, 2), (4, 3), (8, 3), (64, 3)])
def test_k_by_group_size_bounds_the_misfile_chance_at_one_in_ten(g, k):
    assert rules.evidence_groups(g, 0) == k
    if g > 1:
        miss = (1 - 1 / g) ** g  # one group of G all wrong at p = 1/G
        assert miss**k <= rules.EVIDENCE_MISFILE_RATE < miss ** (k - 1)


def test_a_set_k_is_used_as_given_and_bad_values_are_refused():
    assert rules.evidence_groups(4, 1) == 1 and rules.evidence_groups(4, 5) == 5
    with pytest.raises(InvalidArgument, match="pool_evidence"):
        rules.evidence_groups(4, -1)
    with pytest.raises(InvalidArgument, match="group size"):
        rules.evidence_groups(0, 0)


def test_a_run_of_k_verdicts_pools_and_a_heap_verdict_ends_it():
    dest, sp, n = rules.confirm_pool(Pool.UNSOLVED, 0, 0, 2)
    assert (dest, sp, n) == (Pool.HEAP, 3, 1)  # one all-wrong group: still in the heap
    assert rules.confirm_pool(Pool.UNSOLVED, sp, n, 2) == (Pool.UNSOLVED, 3, 2)
    assert rules.confirm_pool(Pool.SOLVED, 3, 1, 2) == (Pool.HEAP, 2, 1)  # the other pool starts afresh
    assert rules.confirm_pool(Pool.HEAP, 3, 5, 2) == (Pool.HEAP, 0, 0)
    assert rules.confirm_pool(Pool.SOLVED, 0, 0, 1) == (Pool.SOLVED, 2, 1)  # k = 1: the paper


def test_an_unconfirmed_problem_waits_at_the_top_of_the_heap():
    assert rules.PENDING_PRIORITY == rules.MAX_PRIORITY


def test_aged_decay_is_lambda_times_gamma_to_the_versions():
    assert rules.aged_decay(0.5, 1.0, 7) == 0.5
    assert rules.aged_decay(0.5, 0.9, 0) == 0.5
    assert rules.aged_decay(0.5, 0.9, 3) == 0.5 * 0.9**3
    assert math.isclose(rules.aged_decay(1.0, 0.5, 2), 0.25)
    with pytest.raises(InvalidArgument, match="must be >= 0"):
        rules.aged_decay(0.5, 0.9, -1)
