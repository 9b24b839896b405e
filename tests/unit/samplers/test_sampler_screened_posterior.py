"""``screened-posterior`` (samplers/screened_posterior.py): screening probes + posterior retests."""

from __future__ import annotations

from prioreplay.priority_server.store import tie_member
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.rules import Pool


async def test_screened_posterior_probes_the_unseen_and_retests_by_the_posterior(make_store):
    store = await make_store(
        "screened-posterior", n=12, retest_fraction=0.25, retest_interval=1, posterior_decay=1.0, probe_size=2
    )
    lease = await store.sample(6)
    assert all(sp.group_size == 2 for sp in lease.problems)  # never tested: probes
    ids = sorted((sp.problem.id for sp in lease.problems), key=lambda i: tie_member(i, 3))  # pool order
    much, little = ids[:3], ids[3:]
    await store.report(lease.lease_id, [GroupOutcome(i, (1.0,) * (16 if i in much else 2)) for i in ids])
    nxt = await store.sample(8)  # quota 2, all six due
    retests = [sp for sp in nxt.problems if sp.source is Pool.SOLVED]
    assert retests[0].problem.id == much[0] and retests[1].problem.id in little  # as ``posterior``
    assert all(sp.group_size is None for sp in retests)  # retests are full groups
    assert all(sp.group_size == 2 for sp in nxt.problems if sp.source is Pool.HEAP)  # the unseen rest: probes
