"""``screened-pools`` (samplers/screened_pools.py): ``screened``, and the retests are probes too."""

from __future__ import annotations

from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.rules import Pool


async def test_screened_pools_probes_the_retests_and_heap_probes_nothing(make_store):
    store = await make_store("screened-pools", retest_fraction=0.5, retest_interval=0, probe_size=3)
    lease = await store.sample(2)
    await store.report(lease.lease_id, [GroupOutcome(sp.problem.id, (1.0, 1.0, 1.0)) for sp in lease.problems])
    lease = await store.sample(4)
    retests = [sp for sp in lease.problems if sp.source is Pool.SOLVED]
    assert len(retests) == 2 and all(sp.group_size == 3 for sp in retests)
    plain = await make_store("heap")
    assert all(sp.group_size is None for sp in (await plain.sample(5)).problems)
