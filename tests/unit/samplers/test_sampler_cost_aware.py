"""``cost-aware`` (samplers/cost_aware.py): the heap share by priority per completion token."""

from __future__ import annotations

from prioreplay.priority_server.store.memory_store import MemoryStore
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.rules import PriorityParams


async def test_cost_aware_prefers_the_cheaper_problem_at_equal_priority(make_store):
    store = await make_store("cost-aware", n=6, retest_fraction=0.0)
    lease = await store.sample(6)
    ids = [sp.problem.id for sp in lease.problems]
    # equal mixed groups (equal priority), completion lengths 10, 20, ... 60 tokens per completion
    await store.report(lease.lease_id, [GroupOutcome(i, (1.0, 0.0, 1.0, 0.0), b"", 4 * 10 * (j + 1)) for j, i in enumerate(ids)])
    got = [sp.problem.id for sp in (await store.sample(3)).problems]
    assert got == ids[:3]  # the three shortest, shortest first


async def test_cost_aware_trades_priority_against_tokens(make_store):
    store = await make_store("cost-aware", n=2, retest_fraction=0.0)
    lease = await store.sample(2)
    a, b = (sp.problem.id for sp in lease.problems)
    # a: p̂ = 1/2 (priority 0.25) at 100 tokens per completion; b: p̂ = 1/4 (0.1875) at 50
    await store.report(
        lease.lease_id, [GroupOutcome(a, (1.0, 0.0, 1.0, 0.0), b"", 400), GroupOutcome(b, (1.0, 0.0, 0.0, 0.0), b"", 200)]
    )
    assert [sp.problem.id for sp in (await store.sample(1)).problems] == [b]  # 0.1875/50 > 0.25/100


async def test_without_token_counts_cost_aware_is_the_heap(make_store):
    heap, cost = await make_store("heap", n=12, retest_fraction=0.0), await make_store("cost-aware", n=12, retest_fraction=0.0)
    for store in (heap, cost):
        lease = await store.sample(12)
        pats = [(1.0, 0.0, 0.0, 0.0), (1.0, 1.0, 0.0, 0.0), (1.0, 1.0, 1.0, 0.0)]
        await store.report(lease.lease_id, [GroupOutcome(sp.problem.id, pats[j % 3]) for j, sp in enumerate(lease.problems)])
    assert [sp.problem.id for sp in (await cost.sample(5)).problems] == [sp.problem.id for sp in (await heap.sample(5)).problems]


async def test_token_means_decay_like_the_statistics_and_survive_a_snapshot(make_store, tmp_path):
    store = await make_store("cost-aware", n=1, retest_fraction=0.0, params=PriorityParams(decay=0.5))
    for tokens in (400, 800):
        lease = await store.sample(1)
        await store.report(lease.lease_id, [GroupOutcome("p0", (1.0, 0.0, 1.0, 0.0), b"", tokens)])
    # completions 0.5·4 + 4 = 6, tokens 0.5·400 + 800 = 1000: mean 1000/6
    assert store._view.completion_tokens(store._s.problems["p0"].member) == 1000 / 6
    store.snapshot_path = tmp_path / "s.json"
    await store.snapshot()
    again = MemoryStore(store.config, tmp_path / "s.json")
    assert again._s.tokens == {"p0": (6.0, 1000.0)}
