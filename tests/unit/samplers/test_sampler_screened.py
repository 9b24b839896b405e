"""``screened`` (samplers/screened.py): problems never tested are probed with probe_size completions."""

from __future__ import annotations

from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.rules import Pool


async def test_screened_probes_problems_never_tested_and_a_mixed_probe_gets_a_full_group(make_store):
    store = await make_store("screened", retest_fraction=0.0, probe_size=2)
    lease = await store.sample(4)
    assert [sp.group_size for sp in lease.problems] == [2, 2, 2, 2]
    a, b, c, d = (sp.problem.id for sp in lease.problems)
    await store.report(
        lease.lease_id,
        [GroupOutcome(a, (1.0, 0.0)), GroupOutcome(b, (1.0, 1.0)), GroupOutcome(c, (0.0, 0.0)), GroupOutcome(d, (0.0, 1.0))],
    )
    assert (await store.problem_state(b)).pool is Pool.SOLVED
    assert (await store.problem_state(c)).pool is Pool.UNSOLVED
    lease = await store.sample(8)
    sizes = {sp.problem.id: sp.group_size for sp in lease.problems}
    assert sizes[a] is None and sizes[d] is None  # mixed probes: a full group (the worker's G) next
    assert sum(g == 2 for g in sizes.values()) == 6  # the six still untested are probed


async def test_screened_does_not_probe_its_retests(make_store):
    store = await make_store("screened", retest_fraction=0.5, retest_interval=0, probe_size=3)
    lease = await store.sample(2)
    await store.report(lease.lease_id, [GroupOutcome(sp.problem.id, (1.0, 1.0, 1.0)) for sp in lease.problems])
    lease = await store.sample(4)
    retests = [sp for sp in lease.problems if sp.source is Pool.SOLVED]
    assert len(retests) == 2 and all(sp.group_size is None for sp in retests)
    assert all(sp.group_size == 3 for sp in lease.problems if sp.source is Pool.HEAP)
