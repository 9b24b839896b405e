"""A waiting pull is woken by the report that queues a group, on both stores: it pulls once,
waits, and pulls again only when woken (memory: an asyncio.Event; Redis: ``XREAD BLOCK``), never
polling in between.
"""

from __future__ import annotations

import asyncio

from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.problems import ProblemRecord


async def _counting_pulls(store) -> list[int]:
    calls = [0]
    pull = store._pull_watched

    async def counted(*a):
        calls[0] += 1
        return await pull(*a)

    store._pull_watched = counted
    return calls


async def _lease_and_report(store, pid: str, rewards=(0.0, 1.0), payload=b"\x12\x02p0") -> None:
    lease = await store.sample(1)
    assert [s.problem.id for s in lease.problems] == [pid]
    assert (await store.report(lease.lease_id, [GroupOutcome(pid, rewards, payload)])).accepted


async def test_a_waiting_pull_is_woken_by_the_report_not_by_polling(store_factory):
    store = store_factory(StoreConfig(seed=3))
    await store.register([ProblemRecord(id="p0", prompt="q", answer="1")])
    calls = await _counting_pulls(store)
    waiting = asyncio.create_task(store.pull("learner", 4, wait_s=60.0))
    await asyncio.sleep(0.5)  # a polling pull would have pulled many times by now
    assert not waiting.done() and calls[0] == 1
    await _lease_and_report(store, "p0")
    got = await asyncio.wait_for(waiting, 30.0)  # far below wait_s: woken, not timed out
    assert [d.delivery_count for d in got] == [1] and calls[0] == 2


async def test_a_group_that_is_not_queued_leaves_the_pull_waiting(store_factory):
    store = store_factory(StoreConfig(seed=3))
    await store.register([ProblemRecord(id="p0", prompt="q", answer="1")])
    waiting = asyncio.create_task(store.pull("learner", 4, wait_s=1.0))
    await asyncio.sleep(0.1)
    await _lease_and_report(store, "p0", rewards=(1.0, 1.0))  # all correct: filtered, not queued
    assert await asyncio.wait_for(waiting, 30.0) == []


async def test_wait_s_zero_pulls_once(store_factory):
    store = store_factory(StoreConfig(seed=3))
    calls = await _counting_pulls(store)
    assert await store.pull("learner", 4) == [] and await store.pull("learner", 4, wait_s=0.0) == []
    assert calls[0] == 0  # the plain pull, no watch


async def test_a_pending_group_that_turns_idle_ends_the_wait(store_factory):
    store = store_factory(StoreConfig(seed=3, redelivery_timeout_s=0.5))
    await store.register([ProblemRecord(id="p0", prompt="q", answer="1")])
    await _lease_and_report(store, "p0")
    assert [d.delivery_count for d in await store.pull("crashed", 4)] == [1]  # pending, never acknowledged
    got = await asyncio.wait_for(store.pull("other", 4, wait_s=60.0), 30.0)  # no report comes: the idle time wakes it
    assert [d.delivery_count for d in got] == [2]
