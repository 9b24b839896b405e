"""``posterior`` (samplers/posterior.py): the heap's top, retests by a step-decayed Beta posterior."""

from __future__ import annotations

import pytest

from prioreplay.priority_server.samplers import posterior_variance
from prioreplay.priority_server.store import tie_member
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.rules import Pool, Stats


def test_posterior_variance_by_hand_and_its_decay_toward_the_prior():
    # n = 4 successes of 4, prior 1: Beta(5, 1): E[p(1-p)] = 5*1 / (6*7)
    assert posterior_variance(Stats(4.0, 4.0, 4.0), 0, 0.9, 1.0) == pytest.approx(5 / 42, abs=1e-15)
    # age 3, decay 0.5: w = 1/8, Beta(1.5, 1): 1.5 / (2.5 * 3.5)
    assert posterior_variance(Stats(4.0, 4.0, 4.0), 3, 0.5, 1.0) == pytest.approx(1.5 / 8.75, abs=1e-15)
    # uncertainty grows with the steps since the last test, toward the prior's 1/6
    v = [posterior_variance(Stats(16.0, 16.0, 16.0), age, 0.95, 1.0) for age in (0, 10, 50, 400)]
    assert v == sorted(v) and v[0] < 0.06 and abs(v[-1] - 1 / 6) < 1e-3
    # decay 1: no change with age
    assert posterior_variance(Stats(4.0, 1.0, 1.0), 0, 1.0, 1.0) == posterior_variance(Stats(4.0, 1.0, 1.0), 99, 1.0, 1.0)


async def test_posterior_retests_take_the_oldest_then_the_most_uncertain(make_store):
    async def retests(sampler: str) -> tuple[list[str], list[str], list[str]]:
        store = await make_store(sampler, n=12, retest_fraction=0.25, retest_interval=1, posterior_decay=1.0)
        lease = await store.sample(6)
        ids = sorted((sp.problem.id for sp in lease.problems), key=lambda i: tie_member(i, 3))  # pool order
        much, little = ids[:3], ids[3:]  # the three first in pool order solved 16/16, the others 2/2
        await store.report(lease.lease_id, [GroupOutcome(i, (1.0,) * (16 if i in much else 2)) for i in ids])
        nxt = await store.sample(8)  # quota floor(8 * 0.25) = 2, all six due
        return [sp.problem.id for sp in nxt.problems if sp.source is Pool.SOLVED], much, little

    got, much, little = await retests("posterior")
    assert got[0] == much[0]  # the oldest in pool order: always retested (no starvation)
    assert got[1] in little  # then the most uncertain posterior: 2/2 is less sure than 16/16
    got, much, _ = await retests("heap")
    assert got == much[:2]  # the paper: least recently tested first, i.e. pool order


async def test_posterior_retests_starve_no_pooled_problem(make_store):
    """A pooled problem the posterior never prefers (much evidence, all correct) is still retested:
    the window's oldest is taken every batch, so once due it waits at most its place in pool order
    + 1 batches."""
    store = await make_store("posterior", n=40, retest_fraction=0.25, retest_interval=0, posterior_decay=1.0)
    lease = await store.sample(10)
    ids = sorted((sp.problem.id for sp in lease.problems), key=lambda i: tie_member(i, 3))  # pool order
    sure = ids[-1]  # the last in pool order, with the most evidence: the posterior's least wanted
    await store.report(lease.lease_id, [GroupOutcome(i, (1.0,) * (64 if i == sure else 2)) for i in ids])
    for batch in range(1, 12):
        lz = await store.sample(8)  # quota 2: R = the oldest + the most uncertain; H = 6 from the heap
        retests = [sp.problem.id for sp in lz.problems if sp.source is not Pool.HEAP]
        assert len(retests) == 2
        # retests stay solved; heap problems stay mixed in the heap
        await store.report(
            lz.lease_id,
            [GroupOutcome(sp.problem.id, (1.0, 1.0) if sp.source is not Pool.HEAP else (1.0, 0.0)) for sp in lz.problems],
        )
        if sure in retests:
            assert retests[0] == sure  # taken as the oldest, never for its score
            assert batch <= len(ids)  # its place in pool order (last of 10) + 1 at most
            return
    pytest.fail(f"{sure} was not retested in 11 batches")
