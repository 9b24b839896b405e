"""The store invariants of ARCHITECTURE.md, each a test, written once for any store.

The invariants of a run over time (versions, retests, bands, re-registration, run settings) are in
``store_semantics_run.py``. Not collected by itself (no ``test_`` file name):
``tests/unit/store/test_memory_store_invariants.py`` runs these tests on the in-process ``memory``
store (no Redis), ``tests/system/store/test_redis_store_invariants.py`` on the ``redis`` store,
each by defining the ``store_factory`` fixture for its store. Time is a fake clock (leases, the
memory queue's redelivery); the Redis stream's redelivery uses Redis's own time, so there a short
real ``redelivery_timeout_s`` is waited out instead.
"""

from __future__ import annotations

import asyncio
import collections
import random

import pytest

from prioreplay.errors import FailedPrecondition, InvalidArgument, NotFound
from prioreplay.priority_server.store import StoreConfig, histogram_edges, tie_member
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.problems import ProblemRecord
from prioreplay.rules import Pool

REDIS_REDELIVERY_S = 0.2


class FakeClock:
    """A settable clock (unix seconds) for deterministic lease and redelivery times."""

    def __init__(self, t: float = 1_700_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def make_problems(n: int, prefix: str = "p") -> list[ProblemRecord]:
    return [ProblemRecord(f"{prefix}{i:04d}", f"What is {i} + 1?", str(i + 1), "exact", {"split": "test"}) for i in range(n)]


def outcome(pid: str, rewards, payload: bytes | None = None) -> GroupOutcome:
    return GroupOutcome(pid, tuple(float(r) for r in rewards), payload if payload is not None else f"group:{pid}".encode())


def bump(dump: dict, **deltas) -> dict:
    """``dump`` with some counters increased (the expected state after a no-op that counts)."""
    out = dict(dump)
    out["counters"] = dict(dump["counters"])
    for k, v in deltas.items():
        out["counters"][k] += v
    return out


async def check_one_place(store, ids) -> dict:
    """Every problem is in exactly one of heap, solved, unsolved, leased (dump, stats, leases agree)."""
    d = await store.dump()
    st = await store.stats()
    assert set(d["problems"]) == set(ids)
    where = collections.Counter(v[0] for v in d["problems"].values())
    assert set(where) <= {int(p) for p in Pool}
    assert (where[Pool.HEAP], where[Pool.SOLVED], where[Pool.UNSOLVED], where[Pool.LEASED]) == (
        st.heap_size,
        st.solved,
        st.unsolved,
        st.leased,
    )
    assert st.heap_size + st.solved + st.unsolved + st.leased == st.problems == len(ids)
    leased = [pid for lease in d["leases"] for pid in lease]
    assert len(leased) == len(set(leased)), "a problem is in two leases"
    assert set(leased) == {pid for pid, v in d["problems"].items() if v[0] == Pool.LEASED}
    assert len(d["leases"]) == st.active_leases
    assert sum(st.priority_histogram) == st.heap_size
    assert st.unseen == sum(1 for v in d["problems"].values() if v[1] == 0), "unseen = problems never reported"
    return d


async def wait_redelivery(kind: str, clock: FakeClock, timeout_s: float) -> None:
    """Let a delivered group become idle for ``timeout_s`` (fake clock; Redis: real time)."""
    clock.advance(timeout_s)
    if kind == "redis":
        await asyncio.sleep(timeout_s + 0.05)


# -- a problem is in exactly one place ----------------------------------------------------------
async def test_problem_is_in_exactly_one_place_through_a_random_workload(store_factory):
    clock = FakeClock()
    store = store_factory(StoreConfig(retest_fraction=0.2, retest_interval=1, seed=3), clock)
    ids = [p.id for p in make_problems(60)]
    assert await store.register(make_problems(60)) == (60, 0, 60)
    rng = random.Random(0)
    live = []
    for _ in range(30):
        lease = await store.sample(rng.randint(1, 16), lease_timeout_s=50)
        batch = [sp.problem.id for sp in lease.problems]
        assert len(batch) == len(set(batch))
        if lease.lease_id:
            live.append(lease)
        action = rng.random()
        if live and action < 0.6:  # report a live lease, maybe leaving some problems out
            lz = live.pop(rng.randrange(len(live)))
            kept = [sp.problem.id for sp in lz.problems if rng.random() < 0.8]
            outs = [outcome(pid, rng.choice([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 1], [0.5, 0.5]])) for pid in kept]
            assert (await store.report(lz.lease_id, outs)).accepted
        elif action < 0.75:  # let every live lease run out
            clock.advance(51)
            live.clear()
        await check_one_place(store, ids)
    # re-registering keeps places and statistics
    before = await store.dump()
    assert await store.register(make_problems(60)) == (0, 60, 60)
    assert (await store.dump())["problems"] == before["problems"]


async def test_unseen_counts_problems_no_report_has_covered(store_factory):
    clock = FakeClock()
    store = store_factory(StoreConfig(seed=1), clock)
    await store.register(make_problems(10))
    assert (await store.stats()).unseen == 10
    lease = await store.sample(4, lease_timeout_s=50)
    assert (await store.stats()).unseen == 10, "a leased problem is not seen until reported"
    ids = [sp.problem.id for sp in lease.problems]
    assert (await store.report(lease.lease_id, [outcome(ids[0], [1, 0]), outcome(ids[1], [0, 0])])).accepted
    assert (await store.stats()).unseen == 8, "reported problems count once, whatever their kind"
    clock.advance(51)  # the other two expire unreported: still unseen
    lease = await store.sample(10, lease_timeout_s=50)
    outs = [outcome(sp.problem.id, [1, 1]) for sp in lease.problems]
    assert (await store.report(lease.lease_id, outs)).accepted
    assert (await store.stats()).unseen == 10 - len({*ids[:2], *(o.problem_id for o in outs)})


# -- a lease is reported at most once -----------------------------------------------------------
async def test_second_report_of_a_lease_changes_nothing(store_factory):
    store = store_factory(StoreConfig(), FakeClock())
    await store.register(make_problems(8))
    lease = await store.sample(4)
    outs = [outcome(sp.problem.id, [1, 0, 1, 1]) for sp in lease.problems]
    first = await store.report(lease.lease_id, outs)
    assert first.accepted and first.groups_queued == 4
    after_first = await store.dump()
    again = await store.report(lease.lease_id, outs)
    assert (again.accepted, again.reason, again.groups_queued) == (False, "already reported", 0)
    assert await store.dump() == bump(after_first, late_reports=1)
    unknown = await store.report("0" * 32, outs)
    assert (unknown.accepted, unknown.reason) == (False, "unknown lease")


async def test_a_report_in_parts_applies_each_problem_once_and_ends_with_the_last_part(store_factory):
    """Issue 13: a lease reported in several ReportOutcomes (a report too large for one message)."""
    store = store_factory(StoreConfig(retest_fraction=0.0), FakeClock())
    await store.register(make_problems(8))
    lease = await store.sample(6, lease_timeout_s=60)
    ids = [sp.problem.id for sp in lease.problems]
    outs = {pid: outcome(pid, [1, 0, 1, 0]) for pid in ids}
    one = await store.report(lease.lease_id, [outs[p] for p in ids[:2]], more_parts=True)
    assert (one.accepted, one.groups_queued, one.skipped) == (True, 2, 0)
    state = await store.dump()
    assert [sorted(x) for x in state["leases"]] == [sorted(ids[2:])]  # still live for the other four
    assert state["counters"]["groups_mixed"] == 2
    # a retried part (its answer lost) changes nothing; a part may repeat an applied problem
    again = await store.report(lease.lease_id, [outs[p] for p in ids[:3]], more_parts=True)
    assert (again.accepted, again.groups_queued, again.skipped) == (True, 1, 2)
    with pytest.raises(InvalidArgument, match="not in lease"):
        await store.report(lease.lease_id, [outcome("p0007" if "p0007" not in ids else "p0006", [1, 0])], more_parts=True)
    # the last part: ids[3] and ids[4]; ids[5] was never reported and returns unchanged
    last = await store.report(lease.lease_id, [outs[p] for p in ids[3:5]])
    assert (last.accepted, last.groups_queued) == (True, 2)
    after = await store.dump()
    assert after["leases"] == [] and after["counters"]["groups_mixed"] == 5
    assert after["counters"]["completions_reported"] == 20
    assert after["problems"][ids[5]][1] == 0  # n = 0: statistics unchanged
    late = await store.report(lease.lease_id, [outs[ids[5]]], more_parts=True)
    assert (late.accepted, late.reason) == (False, "already reported")
    await check_one_place(store, [f"p{i:04d}" for i in range(8)])


async def test_a_part_that_reports_the_last_problems_ends_the_lease(store_factory):
    store = store_factory(StoreConfig(retest_fraction=0.0), FakeClock())
    await store.register(make_problems(4))
    lease = await store.sample(2, lease_timeout_s=60)
    ids = [sp.problem.id for sp in lease.problems]
    await store.report(lease.lease_id, [outcome(ids[0], [1, 0])], more_parts=True)
    await store.report(lease.lease_id, [outcome(ids[1], [1, 1])], more_parts=True)
    assert (await store.dump())["leases"] == []
    repeat = await store.report(lease.lease_id, [outcome(ids[1], [1, 1])])
    assert (repeat.accepted, repeat.reason) == (False, "already reported")


# -- an expired lease returns its problems unchanged --------------------------------------------
async def _store_with_history(store_factory, clock):
    """8 problems: 3 in the solved pool, 3 in the unsolved pool, 2 in the heap with statistics."""
    store = store_factory(StoreConfig(retest_fraction=0.0), clock)
    await store.register(make_problems(8))
    lease = await store.sample(8)
    rewards = [[1, 1, 1], [1, 1, 1], [1, 1, 1], [0, 0, 0], [0, 0, 0], [0, 0, 0], [1, 0, 0], [1, 1, 0]]
    await store.report(lease.lease_id, [outcome(sp.problem.id, r) for sp, r in zip(lease.problems, rewards, strict=True)])
    return store


async def test_expired_lease_returns_problems_with_statistics_unchanged(store_factory):
    clock = FakeClock()
    store = await _store_with_history(store_factory, clock)
    before = await store.dump()
    assert {v[0] for v in before["problems"].values()} == {Pool.HEAP, Pool.SOLVED, Pool.UNSOLVED}
    lease = await store.sample(6, lease_timeout_s=10)
    assert {sp.source for sp in lease.problems} >= {Pool.SOLVED, Pool.UNSOLVED}  # F fills from the pools
    leased = await check_one_place(store, [f"p{i:04d}" for i in range(8)])
    assert sorted(leased["leases"][0]) == sorted(sp.problem.id for sp in lease.problems)
    clock.advance(9.999)
    assert await store.expire_leases() == 0
    clock.advance(0.001)  # deadline <= now: due
    assert await store.expire_leases() == 1
    after = await store.dump()
    assert after["problems"] == before["problems"]
    assert after["leases"] == [] and after["step"] == before["step"] + 1
    assert after["counters"] == bump(before, lease_expiries=1)["counters"]
    late = await store.report(lease.lease_id, [outcome(lease.problems[0].problem.id, [1, 0])])
    assert (late.accepted, late.reason) == (False, "expired")
    assert await store.dump() == bump(after, late_reports=1)


async def test_due_lease_is_expired_by_a_late_report_and_by_sampling(store_factory):
    clock = FakeClock()
    store = await _store_with_history(store_factory, clock)
    before = await store.dump()
    lease = await store.sample(3, lease_timeout_s=5)
    clock.advance(6)
    late = await store.report(lease.lease_id, [outcome(lease.problems[0].problem.id, [1, 0])])
    assert (late.accepted, late.reason) == (False, "expired")
    d = await store.dump()
    assert d["problems"] == before["problems"] and d["leases"] == []
    assert d["counters"] == bump(before, lease_expiries=1, late_reports=1)["counters"]
    # a due lease is reaped by the next sample, which may then lease the same problems again
    lease2 = await store.sample(8, lease_timeout_s=5)
    clock.advance(5)
    lease3 = await store.sample(8, lease_timeout_s=5)
    assert sorted(sp.problem.id for sp in lease3.problems) == sorted(sp.problem.id for sp in lease2.problems)
    assert (await store.stats()).lease_expiries == 2


# -- renewing a lease (RenewLease) --------------------------------------------------------------
async def test_renew_moves_the_deadline_and_changes_nothing_else(store_factory):
    clock = FakeClock()
    store = await _store_with_history(store_factory, clock)
    before = await store.dump()
    lease = await store.sample(3, lease_timeout_s=10, worker_id="w1")
    leased = await store.dump()
    clock.advance(8)
    renewed = await store.renew(lease.lease_id, "w1", 10)
    assert (renewed.deadline, renewed.problems) == (clock.t + 10, 3)
    assert await store.dump() == leased  # step, statistics, counters and the lease as they were
    clock.advance(5)  # past the first deadline, before the new one
    assert await store.expire_leases() == 0
    assert (await store.dump())["leases"] == leased["leases"]
    again = await store.renew(lease.lease_id, "w1", 0)  # 0: the server's lease_timeout_s
    assert again.deadline == clock.t + store.config.lease_timeout_s
    shorter = await store.renew(lease.lease_id, "w1", 1)  # a deadline may also move earlier
    assert shorter.deadline == clock.t + 1
    clock.advance(1)
    assert await store.expire_leases() == 1
    after = await store.dump()
    assert after["problems"] == before["problems"] and after["leases"] == []
    assert after["counters"] == bump(before, lease_expiries=1)["counters"]


async def test_renew_of_an_unknown_reported_expired_or_other_workers_lease_is_refused(store_factory):
    clock = FakeClock()
    store = store_factory(StoreConfig(retest_fraction=0.0, max_lease_timeout_s=3600), clock)
    await store.register(make_problems(8))
    with pytest.raises(NotFound, match=r"lease 0{32} cannot be renewed: unknown lease"):
        await store.renew("0" * 32, "w1", 10)
    mine = await store.sample(2, lease_timeout_s=10, worker_id="w1")
    state = await store.dump()
    with pytest.raises(FailedPrecondition, match=rf"lease {mine.lease_id} was sampled by worker 'w1', not 'w2'"):
        await store.renew(mine.lease_id, "w2", 10)
    with pytest.raises(FailedPrecondition, match="not ''"):
        await store.renew(mine.lease_id, "", 10)
    with pytest.raises(InvalidArgument, match=r"--max-lease-timeout-s"):
        await store.renew(mine.lease_id, "w1", 3601)
    with pytest.raises(InvalidArgument, match="lease_id is empty"):
        await store.renew("", "w1", 10)
    assert await store.dump() == state  # nothing changed
    anonymous = await store.sample(2, lease_timeout_s=10)  # sampled without a worker id: renewed without one
    assert (await store.renew(anonymous.lease_id, "", 10)).problems == 2
    assert (await store.report(mine.lease_id, [outcome(mine.problems[0].problem.id, [1, 0])])).accepted
    with pytest.raises(NotFound, match="already reported"):
        await store.renew(mine.lease_id, "w1", 10)
    before = await store.dump()
    clock.advance(10)  # due, not reaped: the renew expires it, as a late report does
    with pytest.raises(NotFound, match="expired"):
        await store.renew(anonymous.lease_id, "", 10)
    after = await store.dump()
    assert after["leases"] == [] and after["counters"] == bump(before, lease_expiries=1)["counters"]
    with pytest.raises(NotFound, match="expired"):
        await store.renew(anonymous.lease_id, "", 10)
    assert await store.dump() == after


async def test_renew_after_a_partial_report_extends_only_the_rest(store_factory):
    clock = FakeClock()
    store = store_factory(StoreConfig(retest_fraction=0.0), clock)
    await store.register(make_problems(6))
    lease = await store.sample(4, lease_timeout_s=10, worker_id="w1")
    ids = [sp.problem.id for sp in lease.problems]
    assert (await store.report(lease.lease_id, [outcome(p, [1, 0]) for p in ids[:2]], more_parts=True)).accepted
    assert (await store.renew(lease.lease_id, "w1", 30)).problems == 2
    clock.advance(20)  # past the first deadline
    assert await store.expire_leases() == 0
    d = await store.dump()
    assert d["leases"] == [sorted(ids[2:])]
    assert {d["problems"][p][0] for p in ids[:2]} == {Pool.HEAP} and {d["problems"][p][0] for p in ids[2:]} == {Pool.LEASED}
    last = await store.report(lease.lease_id, [outcome(p, [0, 1]) for p in ids[2:]])
    assert last.accepted and last.groups_queued == 2
    assert (await store.stats()).groups_mixed == 4
    await check_one_place(store, [p.id for p in make_problems(6)])


async def test_a_retried_sample_gets_its_renewed_lease_until_the_new_deadline(store_factory):
    clock = FakeClock()
    store = store_factory(StoreConfig(retest_fraction=0.0), clock)
    await store.register(make_problems(6))
    first = await store.sample(2, lease_timeout_s=10, request_id="w1\tr1", worker_id="w1")
    renewed = await store.renew(first.lease_id, "w1", 30)
    clock.advance(15)  # past the first deadline: a sample with another id prunes the ids due by then
    other = await store.sample(2, lease_timeout_s=10, request_id="w1\tr2", worker_id="w1")
    retry = await store.sample(2, lease_timeout_s=10, request_id="w1\tr1", worker_id="w1")
    assert (retry.lease_id, retry.deadline) == (first.lease_id, renewed.deadline)
    assert [sp.problem.id for sp in retry.problems] == [sp.problem.id for sp in first.problems]
    assert other.lease_id != first.lease_id
    clock.advance(15)  # the renewed lease is due: the id samples anew
    fresh = await store.sample(2, lease_timeout_s=10, request_id="w1\tr1", worker_id="w1")
    assert fresh.lease_id not in (first.lease_id, other.lease_id)


# -- the trajectory queue: at least once, never after ack ---------------------------------------
async def test_every_group_is_delivered_and_an_acked_one_never_again(store_factory):
    clock = FakeClock()
    timeout = REDIS_REDELIVERY_S if store_factory.kind == "redis" else 30.0
    store = store_factory(StoreConfig(redelivery_timeout_s=timeout), clock)
    await store.register(make_problems(6))
    lease = await store.sample(6)
    order = [sp.problem.id for sp in lease.problems]
    payloads = [f"traj:{pid}".encode() for pid in order]
    res = await store.report(lease.lease_id, [outcome(pid, [1, 0], p) for pid, p in zip(order, payloads, strict=True)])
    assert res.groups_queued == 6
    assert (await store.stats()).queue_depth == 6

    a1 = await store.pull("A", 2)
    assert [d.payload for d in a1] == payloads[:2] and all(d.delivery_count == 1 for d in a1)
    b1 = await store.pull("B", 10)  # A's deliveries are not idle yet: B gets only new groups
    assert [d.payload for d in b1] == payloads[2:] and all(d.delivery_count == 1 for d in b1)
    keys = [tuple(map(int, d.group_id.split("-"))) for d in a1 + b1]
    assert keys == sorted(keys) and len(set(keys)) == 6  # ids increase in report order
    assert await store.pull("A", 10) == []
    st = await store.stats()
    assert (st.queue_depth, st.pending_groups) == (0, 6)

    assert await store.ack([d.group_id for d in b1]) == (4, 0)
    assert await store.ack([d.group_id for d in b1] + ["1-0"]) == (0, 5)
    await wait_redelivery(store_factory.kind, clock, timeout)
    b2 = await store.pull("B", 10)  # A never acked: reclaimed by B, the acked ones never again
    assert [d.payload for d in b2] == payloads[:2] and all(d.delivery_count == 2 for d in b2)
    b3 = await store.pull("B", 10, include_own_pending=True)
    assert [d.payload for d in b3] == payloads[:2] and all(d.delivery_count == 3 for d in b3)
    assert await store.pull("A", 10, include_own_pending=True) == []

    assert await store.ack([d.group_id for d in b3]) == (2, 0)
    await wait_redelivery(store_factory.kind, clock, timeout)
    assert await store.pull("A", 10) == [] and await store.pull("B", 10, include_own_pending=True) == []
    st = await store.stats()
    assert (st.queue_depth, st.pending_groups, st.groups_acked) == (0, 0, 6)
    delivered = {d.payload for d in a1 + b1 + b2 + b3}
    assert delivered == set(payloads)


async def test_only_mixed_groups_are_queued(store_factory):
    store = store_factory(StoreConfig(), FakeClock())
    await store.register(make_problems(4))
    lease = await store.sample(4)
    rewards = [[1, 1], [0, 0], [0.5, 0.5], [0, 1]]
    res = await store.report(lease.lease_id, [outcome(sp.problem.id, r) for sp, r in zip(lease.problems, rewards, strict=True)])
    assert (res.groups_queued, res.groups_filtered) == (1, 3)
    d = await store.dump()
    assert d["queue"] == [f"group:{lease.problems[3].problem.id}".encode()]
    c = d["counters"]
    assert (c["groups_mixed"], c["groups_all_correct"], c["groups_all_wrong"], c["groups_constant"]) == (1, 1, 1, 1)
    assert (c["completions_reported"], c["reward_sum"]) == (8, float(sum(map(sum, rewards))))


# -- sampling never blocks ------------------------------------------------------------------------
async def test_sampling_never_blocks_on_an_empty_or_fully_leased_store(store_factory):
    clock = FakeClock()
    store = store_factory(StoreConfig(), clock)
    empty = await asyncio.wait_for(store.sample(8), timeout=5)
    assert (empty.problems, empty.lease_id, empty.step) == ([], "", 0)
    assert empty.retry_after_s == 1.0  # no lease exists

    await store.register(make_problems(5))
    short = await asyncio.wait_for(store.sample(8, lease_timeout_s=3), timeout=5)
    assert len(short.problems) == 5 and short.lease_id
    assert short.retry_after_s == pytest.approx(max(0.05, min(5.0, short.deadline - clock())))
    none = await asyncio.wait_for(store.sample(8), timeout=5)
    assert none.problems == [] and none.lease_id == "" and none.step == short.step
    assert none.retry_after_s == pytest.approx(min(5.0, short.deadline - clock())) and none.retry_after_s > 0
    clock.advance(2.99)
    assert (await store.sample(8)).retry_after_s == pytest.approx(0.05)  # floor of the hint

    # heap empty, problems in the pools: the batch fills from the pools
    await store.report(short.lease_id, [outcome(sp.problem.id, [1, 1]) for sp in short.problems])
    assert (await store.stats()).heap_size == 0
    pooled = await store.sample(8)
    assert len(pooled.problems) == 5 and {sp.source for sp in pooled.problems} == {Pool.SOLVED}
    assert pooled.retry_after_s > 0
    everything_leased = await store.sample(5)
    assert everything_leased.problems == [] and everything_leased.retry_after_s > 0
    await store.register(make_problems(3, prefix="q"))
    exact = await store.sample(3)
    assert len(exact.problems) == 3 and exact.retry_after_s == 0.0


# -- samplers and the histogram -------------------------------------------------------------------
async def _heap_with_zero_priority_half(store_factory, sampler):
    """40 problems in the heap: 20 unseen (priority 0.25), 20 with constant rewards (priority 0)."""
    clock = FakeClock()
    store = store_factory(StoreConfig(sampler=sampler, retest_fraction=0.0, seed=2), clock)
    await store.register(make_problems(20, "z"))
    lease = await store.sample(20)
    await store.report(lease.lease_id, [outcome(sp.problem.id, [0.5, 0.5]) for sp in lease.problems])
    await store.register(make_problems(20, "u"))
    return store, clock


@pytest.mark.parametrize("sampler", ["weighted", "uniform"])
async def test_weighted_sampler_skips_zero_priority_and_uniform_does_not(store_factory, sampler):
    store, clock = await _heap_with_zero_priority_half(store_factory, sampler)
    st = await store.stats(5)
    assert (st.heap_size, st.priority_histogram[0], st.priority_histogram[-1]) == (40, 20, 20)
    picked = collections.Counter()
    for _ in range(10):
        lease = await store.sample(8, lease_timeout_s=1)
        assert len(lease.problems) == 8 and all(sp.source is Pool.HEAP for sp in lease.problems)
        picked.update(sp.problem.id[0] for sp in lease.problems)
        clock.advance(1)  # the lease expires; the next sample returns its problems first
    if sampler == "weighted":  # acceptance (priority / 0.25)^alpha = 0 for a zero priority
        assert picked["z"] == 0 and picked["u"] == 80
    else:
        assert 20 <= picked["z"] <= 60


async def test_priority_histogram_counts_heap_priorities(store_factory):
    store = store_factory(StoreConfig(retest_fraction=0.0), FakeClock())
    await store.register(make_problems(12))
    lease = await store.sample(9)
    rewards = [[1, 0], [1, 0, 0, 0], [1, 1, 1, 0], [0.5, 0.5], [0.5, 0.5], [1, 0, 0, 0, 0, 0, 0, 0], [1, 1], [0, 0], [0.2, 0.8]]
    await store.report(lease.lease_id, [outcome(sp.problem.id, r) for sp, r in zip(lease.problems, rewards, strict=True)])
    heap = [v[4] for v in (await store.dump())["problems"].values() if v[0] == Pool.HEAP]
    for buckets in (1, 4, 10):
        st = await store.stats(buckets)
        edges = histogram_edges(buckets)
        assert st.priority_bucket_edges == edges
        expected = [
            sum(1 for p in heap if edges[i] <= p < edges[i + 1] or (i == buckets - 1 and p == edges[-1])) for i in range(buckets)
        ]
        assert st.priority_histogram == expected and sum(expected) == len(heap) == 10
    # width 1/16: [0, 0 (constant groups)] [0.09, 7/64] [] [3/16 ×2 (edge, lower-inclusive), 0.25 ×4 (last edge, inclusive)]
    assert (await store.stats(4)).priority_histogram == [2, 2, 0, 6]


# -- ties do not follow dataset order -------------------------------------------------------------
async def test_ties_do_not_follow_dataset_order(store_factory):
    config = StoreConfig(seed=11)
    store = store_factory(config, FakeClock())
    problems = make_problems(1000)
    ids = [p.id for p in problems]
    await store.register(problems)
    lease = await store.sample(32)
    batch = [sp.problem.id for sp in lease.problems]
    assert len(batch) == 32 and batch != ids[:32]
    assert batch != sorted(batch)
    # every problem is at 0.25: the batch is the top of the seeded tie order (member desc)
    expected = sorted(ids, key=lambda i: tie_member(i, config.seed), reverse=True)[:32]
    assert batch == expected
    assert len(set(batch) & set(ids[:100])) < 16


# -- report validation ----------------------------------------------------------------------------
async def test_invalid_reports_are_refused_and_change_nothing(store_factory):
    store = store_factory(StoreConfig(), FakeClock())
    await store.register(make_problems(8))
    lease = await store.sample(4)
    leased = [sp.problem.id for sp in lease.problems]
    other = next(p.id for p in make_problems(8) if p.id not in leased)
    before = await store.dump()
    bad_reports = {
        "not in lease": [outcome(leased[0], [1, 0]), outcome(other, [1, 0])],
        "unknown problem": [outcome("nope", [1, 0])],
        "NaN": [outcome(leased[0], [1.0, float("nan")])],
        "out of range": [outcome(leased[0], [1.5])],
        "empty group": [outcome(leased[0], [])],
        "twice": [outcome(leased[0], [1, 0]), outcome(leased[0], [1, 0])],
    }
    for name, outs in bad_reports.items():
        with pytest.raises(InvalidArgument):
            await store.report(lease.lease_id, outs)
        assert await store.dump() == before, name
    with pytest.raises(InvalidArgument) as err:
        await store.report(lease.lease_id, [outcome(other, [1, 0])])
    assert other in str(err.value)
    ok = await store.report(lease.lease_id, [outcome(pid, [1, 0]) for pid in leased])
    assert ok.accepted  # the lease was still live after the refused reports
    with pytest.raises(NotFound, match="nope"):
        await store.problem_state("nope")
