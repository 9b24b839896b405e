"""``weighted`` (samplers/weighted.py): heap slots drawn ∝ priority^alpha by rejection.

The expected draws are recomputed here from the RNG (XorShift32 seeded with step_seed) and the
heap order (priority desc, tie-break member desc), independently of the sampler's code.
"""

from __future__ import annotations

from prioreplay.priority_server.samplers import XorShift32, step_seed
from prioreplay.priority_server.store import tie_member
from prioreplay.priority_server.store.records import GroupOutcome


async def test_weighted_on_equal_priorities_draws_ranks_from_the_step_rng(make_store):
    store = await make_store("weighted", n=10, retest_fraction=0.0)
    heap = sorted((f"p{i}" for i in range(10)), key=lambda i: tie_member(i, 3), reverse=True)
    rng = XorShift32(step_seed(3, 1))  # the first batch is step 1
    expected = []
    for _ in range(4):
        rank = int(rng.random() * len(heap))  # u1: the rank; every unseen problem has priority 0.25
        rng.random()  # u2 < (0.25 / 0.25)^alpha = 1: always accepted
        expected.append(heap.pop(rank))
    assert [sp.problem.id for sp in (await store.sample(4)).problems] == expected


async def test_weighted_with_a_large_alpha_prefers_the_highest_priority(make_store):
    store = await make_store("weighted", n=20, retest_fraction=0.0, alpha=30.0)
    lease = await store.sample(20)
    # four problems at p = 1/2 (priority 1/4), the others at p = 15/16 (priority 15/256)
    best = {sp.problem.id for sp in lease.problems[:4]}
    await store.report(
        lease.lease_id,
        [GroupOutcome(sp.problem.id, (1.0, 0.0) * 8 if j < 4 else (1.0,) * 15 + (0.0,)) for j, sp in enumerate(lease.problems)],
    )
    served = []
    for _ in range(5):
        lz = await store.sample(2)
        served += [sp.problem.id for sp in lz.problems]
        await store.report(lz.lease_id, [])
    # (15/64)^30 ≈ 1e-19: a low-priority draw is never accepted, so a slot takes a 1/4 or the top
    assert set(served) <= best
    assert len(set(served)) > 2  # not always the same top two: the draws move over the best four
