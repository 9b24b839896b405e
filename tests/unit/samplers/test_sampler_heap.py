"""``heap`` (samplers/heap.py): the top of the heap in heap order, retests least recently tested first."""

from __future__ import annotations

from prioreplay.priority_server.store import tie_member
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.rules import Pool


async def test_heap_serves_the_highest_priorities_first_in_priority_then_member_order(make_store):
    store = await make_store("heap", n=6, retest_fraction=0.0)
    lease = await store.sample(6)
    # p = 1/2 (priority 1/4), p = 3/4 (3/16), p = 1/4 (3/16), p = 7/8 (7/64): a distinct order
    rewards = [(1.0, 0.0), (1.0, 1.0, 1.0, 0.0), (1.0, 0.0, 0.0, 0.0), (1.0,) * 7 + (0.0,), (1.0, 0.0), (0.0, 1.0)]
    ids = [sp.problem.id for sp in lease.problems]
    await store.report(lease.lease_id, [GroupOutcome(i, r) for i, r in zip(ids, rewards, strict=True)])
    prio = {i: (sum(r) / len(r)) * (1 - sum(r) / len(r)) for i, r in zip(ids, rewards, strict=True)}
    expected = sorted(ids, key=lambda i: (prio[i], tie_member(i, store.config.seed)), reverse=True)
    got = [sp.problem.id for sp in (await store.sample(4)).problems]
    assert got == expected[:4]
    assert all(sp.group_size is None for sp in lease.problems)


async def test_heap_retests_due_pooled_problems_least_recently_tested_first(make_store):
    store = await make_store("heap", n=8, retest_fraction=0.25, retest_interval=1)
    first = await store.sample(2)  # quota 1: no pooled problem yet, both from the heap
    await store.report(first.lease_id, [GroupOutcome(sp.problem.id, (1.0, 1.0)) for sp in first.problems])
    second = await store.sample(4)  # step 2: both solved ones due (tested at step 1, interval 1); quota 1
    sources = [sp.source for sp in second.problems]
    assert sources == [Pool.SOLVED, Pool.HEAP, Pool.HEAP, Pool.HEAP]
    solved_order = sorted((sp.problem.id for sp in first.problems), key=lambda i: tie_member(i, store.config.seed))
    assert second.problems[0].problem.id == solved_order[0]


async def test_with_retest_versions_heap_retests_wait_for_versions_and_rank_by_versions_elapsed(make_store):
    store = await make_store("heap", n=8, retest_fraction=0.5, retest_versions=2)
    await store.publish(1, "ckpt/v1")
    first = await store.sample(2)  # quota 1, pools empty: both from the heap
    await store.report(first.lease_id, [GroupOutcome(sp.problem.id, (0.0, 0.0)) for sp in first.problems])
    assert {(await store.problem_state(sp.problem.id)).score for sp in first.problems} == {1.0}  # the version
    assert [sp.source for sp in (await store.sample(2)).problems] == [Pool.HEAP, Pool.HEAP]  # 0 versions old
    await store.publish(3, "ckpt/v3")
    assert [sp.source for sp in (await store.sample(2)).problems] == [Pool.UNSOLVED, Pool.HEAP]  # 2 versions old
