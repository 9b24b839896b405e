"""``gumbel`` (samplers/gumbel.py): a Gumbel-top-k draw over the top of the heap."""

from __future__ import annotations

from prioreplay.priority_server.store.records import GroupOutcome


async def test_gumbel_serves_lower_priority_problems_and_a_cold_temperature_is_the_heap(make_store):
    async def top(sampler: str, seed_steps: int, **kw) -> tuple[set[str], list[list[str]]]:
        store = await make_store(sampler, n=40, retest_fraction=0.0, **kw)
        lease = await store.sample(40)  # every problem once
        # five problems at p = 1/2 (priority 0.25), the rest mixed at p = 7/8 (priority 7/64)
        await store.report(
            lease.lease_id,
            [
                GroupOutcome(sp.problem.id, (1.0, 0.0) * 4 if j < 5 else (1.0,) * 7 + (0.0,))
                for j, sp in enumerate(lease.problems)
            ],
        )
        out = []
        for _ in range(seed_steps):
            lz = await store.sample(5)
            out.append([sp.problem.id for sp in lz.problems])
            await store.report(lz.lease_id, [])  # returned unchanged
        return {sp.problem.id for sp in lease.problems[:5]}, out

    best, heap = await top("heap", 6)
    assert all(set(h) == best for h in heap)
    best, cold = await top("gumbel", 6, gumbel_temperature=1e-3)
    assert all(set(c) == best for c in cold)
    best, warm = await top("gumbel", 6, gumbel_temperature=1.0)
    assert any(set(w) != best for w in warm)
