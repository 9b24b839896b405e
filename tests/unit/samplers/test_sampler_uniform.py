"""``uniform`` (samplers/uniform.py): the baseline, uniform over heap + pools, no retest quota."""

from __future__ import annotations

from prioreplay.priority_server.samplers import SAMPLERS, XorShift32, step_seed
from prioreplay.priority_server.store import tie_member
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.rules import Pool


async def test_uniform_draws_indices_over_every_problem_from_the_step_rng(make_store):
    store = await make_store("uniform", n=10)
    order = sorted((f"p{i}" for i in range(10)), key=lambda i: tie_member(i, 3), reverse=True)  # heap order
    rng = XorShift32(step_seed(3, 1))
    expected = [order.pop(int(rng.random() * len(order))) for _ in range(5)]
    assert [sp.problem.id for sp in (await store.sample(5)).problems] == expected


async def test_uniform_serves_pooled_problems_without_a_quota(make_store):
    assert not SAMPLERS["uniform"].retests
    store = await make_store("uniform", n=20, retest_fraction=1.0, retest_interval=10**6)
    lease = await store.sample(20)
    await store.report(
        lease.lease_id, [GroupOutcome(sp.problem.id, (1.0, 1.0) if j < 10 else (1.0, 0.0)) for j, sp in enumerate(lease.problems)]
    )
    # a retest interval no pooled problem reaches, yet uniform draws from the solved pool anyway
    sources = {sp.source for sp in (await store.sample(10)).problems}
    assert Pool.SOLVED in sources and Pool.HEAP in sources
