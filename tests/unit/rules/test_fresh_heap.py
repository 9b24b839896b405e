"""The heap's ageing between reports (FreshPER): rules.fresh_priority_now and the time-invariant
heap key rules.fresh_key / fresh_key_priority that both stores score the heap with."""

from __future__ import annotations

import math
import random

import pytest

from prioreplay import rules
from prioreplay.errors import InvalidArgument


def test_the_aged_priority_moves_from_the_measured_one_toward_the_prior():
    assert rules.fresh_priority_now(0.05, 0.25, 0, 0.9) == 0.05  # just reported: as measured
    assert math.isclose(rules.fresh_priority_now(0.05, 0.25, 1, 0.9), 0.25 - 0.2 * 0.9)
    assert math.isclose(rules.fresh_priority_now(0.05, 0.25, 10, 0.5), 0.25 - 0.2 * 0.5**10)
    assert math.isclose(rules.fresh_priority_now(0.2, 0.1, 3, 0.5), 0.1 + 0.1 * 0.125)  # above the prior: down to it
    assert rules.fresh_priority_now(0.05, 0.25, 40, 1.0) == 0.05  # gamma_h = 1: no ageing
    assert abs(rules.fresh_priority_now(0.0, 0.25, 2000, 0.9) - 0.25) < 1e-12  # long stale: the prior's
    with pytest.raises(InvalidArgument, match="must be >= 0"):
        rules.fresh_priority_now(0.1, 0.25, -1, 0.9)
    with pytest.raises(InvalidArgument, match="heap_age_decay"):
        rules.fresh_priority_now(0.1, 0.25, 1, 0.0)


@pytest.mark.parametrize(("prior", "gamma"), [(0.25, 0.9), (0.1875, 0.5), (0.0, 0.99)])
def test_the_key_orders_members_as_their_aged_priorities_at_every_later_version(prior, gamma):
    rng = random.Random(7)
    members = [(rng.choice([0.0, 0.25, prior, rng.uniform(0, 0.25)]), rng.randrange(0, 60)) for _ in range(300)]
    keys = [rules.fresh_key(w, prior, v, gamma) for w, v in members]
    for now in (60, 75, 400):
        aged = [rules.fresh_priority_now(w, prior, now - v, gamma) for w, v in members]
        by_key = sorted(range(len(members)), key=lambda i: -keys[i])
        ordered = [aged[i] for i in by_key]
        # non-increasing, up to the log scale's resolution (and ties at the prior, which never move)
        assert all(a >= b - 1e-12 * max(abs(b - prior), 1e-300) - 1e-15 for a, b in zip(ordered, ordered[1:], strict=False))
        for i in range(0, 300, 17):  # the inverse reads the aged priority back off the key
            assert math.isclose(rules.fresh_key_priority(keys[i], prior, now, gamma), aged[i], rel_tol=1e-9, abs_tol=1e-15)


def test_a_stale_low_priority_overtakes_a_fresh_middling_one_and_the_sign_bands_hold():
    old_low = rules.fresh_key(0.01, 0.25, 0, 0.8)  # p near 0 measured at version 0
    new_mid = rules.fresh_key(0.15, 0.25, 10, 0.8)  # measured at version 10
    # at version 10: 0.25 - 0.24 * 0.8^10 = 0.224 > 0.15: the stale one is due first
    assert old_low > new_mid
    assert rules.fresh_key(0.25, 0.25, 3, 0.8) == 0.0  # at the prior: key 0, above every d < 0
    assert rules.fresh_key(0.2, 0.1, 0, 0.8) > 0.0 > rules.fresh_key(0.05, 0.1, 10**6, 0.8)  # no crossing of the prior
    assert math.isfinite(rules.fresh_key(5e-324, 0.0, 10**9, 0.5))  # no overflow at any version
