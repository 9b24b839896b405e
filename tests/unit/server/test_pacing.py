"""The pace bound without gRPC or Redis: the room rule (store/pace.py), the memory store's cut and
refusal (store/base.py, "sample" 1b), and the gate's wait, budget and wake-ups (pacing.py)."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from prioreplay.priority_server.pacing import Pacing
from prioreplay.priority_server.samplers import retest_quota
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.memory_store import MemoryStore
from prioreplay.priority_server.store.pace import LocalPace, pace_limit, pace_room
from prioreplay.priority_server.store.records import GroupOutcome, ReportResult
from prioreplay.problems import ProblemRecord


def _ahead(n: int):
    calls = []

    def ahead() -> int:
        calls.append(1)
        return n

    return ahead, calls


def test_the_room_is_k_learner_batches_less_what_is_ahead():
    off = StoreConfig()
    ahead, calls = _ahead(100)
    assert pace_room(off, 8, ahead, 0) == 8 and not calls  # no bound: nothing read
    cfg = StoreConfig(pace_batches=2, pace_batch_groups=5)
    assert pace_room(cfg, 8, _ahead(3)[0], 0) == 7  # 2 x 5 - 3 (before any learner declared its batch)
    assert pace_room(cfg, 8, _ahead(3)[0], 4) == 5  # the learner declared 4: 2 x 4 - 3
    assert pace_room(cfg, 4, _ahead(0)[0], 4) == 4  # never more than asked
    assert pace_room(cfg, 8, _ahead(12)[0], 4) == -4  # over the bound (a smaller batch declared): none
    assert pace_room(StoreConfig(pace_batches=3), 6, _ahead(14)[0], 0) == 4  # no batch known: the call's own, 3 x 6 - 14
    assert (pace_limit(cfg, 0), pace_limit(cfg, 4), pace_limit(off, 4)) == (10, 8, 0)


async def _store(**kw) -> MemoryStore:
    now = [1_700_000_000.0]
    store = MemoryStore(StoreConfig(seed=3, lease_timeout_s=30.0, **kw), clock=lambda: now[0])
    store.now = now  # type: ignore[attr-defined]  # the test moves the clock
    await store.register([ProblemRecord(f"p{i:02d}", f"{i} + 1", str(i + 1)) for i in range(30)])
    return store


async def test_a_batch_is_cut_to_the_room_with_the_retest_quota_of_the_cut_batch():
    store = await _store(pace_batches=1, pace_batch_groups=5, retest_fraction=0.5, retest_interval=0)
    first = await store.sample(3)
    solved = [GroupOutcome(s.problem.id, (1.0, 1.0), b"x") for s in first.problems]  # pooled, not queued
    assert (await store.report(first.lease_id, solved)).groups_filtered == 3
    second = await store.sample(3)  # 3 more in flight, 2 places left of 5
    cut = await store.sample(9)
    assert len(second.problems) == 3 and len(cut.problems) == 2 and not cut.paced
    assert sum(s.source.name != "HEAP" for s in cut.problems) == retest_quota(2, 0.5, cut.step)  # the quota of B' = 2
    assert cut.retry_after_s > 0  # a short batch against the 9 asked for


async def test_no_room_changes_nothing_and_says_when_an_expiry_could_make_some():
    store = await _store(pace_batches=1, pace_batch_groups=2)
    lease = await store.sample(2, 30.0)
    before = await store.dump()
    refused = await store.sample(1)
    assert (refused.paced, refused.problems, refused.lease_id, refused.step) == (True, [], "", lease.step)
    assert refused.retry_after_s == pytest.approx(30.0)  # until the earliest lease deadline
    assert await store.dump() == before
    store.now[0] += 31.0  # the lease is due: the next sample expires it first, then has room
    assert len((await store.sample(2)).problems) == 2
    queued = await _store(pace_batches=1, pace_batch_groups=1)  # nothing leased, one group queued
    q = await queued.sample(1)
    await queued.report(q.lease_id, [GroupOutcome(q.problems[0].problem.id, (0.0, 1.0), b"g")])
    assert (await queued.sample(1)).retry_after_s == math.inf  # no lease to expire: only a pull makes room


async def test_a_signal_between_the_mark_and_the_wait_is_not_lost():
    pace = LocalPace()
    mark = await pace.mark()
    await pace.signal()  # before anyone waits
    t0 = time.monotonic()
    await pace.wait(mark, 5.0)
    assert time.monotonic() - t0 < 1.0
    t0 = time.monotonic()
    await pace.wait(await pace.mark(), 0.2)  # a fresh mark: no signal, the timeout ends it
    assert 0.15 < time.monotonic() - t0 < 2.0
    await pace.note_learner_batch(4)
    assert pace.learner_batch == 4 and await pace.read_learner_batch() == 4


async def test_a_declared_batch_wakes_the_waiting_calls_only_when_it_grows_the_bound():
    """A first declaration equal to ``pace_batch_groups`` (the batch the bound already used) makes
    no room: waking every waiting call for it would cost each a sample that finds none."""
    pace = LocalPace()
    mark = await pace.mark()
    await pace.note_learner_batch(2, floor=2)
    assert not mark.is_set()
    await pace.note_learner_batch(3, floor=2)
    assert mark.is_set()
    mark = await pace.mark()
    await pace.note_learner_batch(3, floor=2)  # unchanged
    await pace.note_learner_batch(1, floor=2)  # shrank
    assert not mark.is_set() and pace.learner_batch == 1


async def test_a_held_call_waits_for_the_pull_and_samples_twice_until_woken():
    store = await _store(pace_batches=1, pace_batch_groups=2)
    gate = Pacing(store, wait_s=10.0)
    lease = await store.sample(2)
    await store.report(lease.lease_id, [GroupOutcome(s.problem.id, (0.0, 1.0), b"g") for s in lease.problems])
    samples = [0]
    sample = store.sample

    async def counted(*a, **kw):
        samples[0] += 1
        return await sample(*a, **kw)

    store.sample = counted  # type: ignore[method-assign]
    held = asyncio.create_task(gate.sample(2, None, "", "w"))
    await asyncio.sleep(0.3)
    assert not held.done() and samples[0] == 2
    await store.pull("L", 2)
    await gate.delivered(2)  # what the servicer does after PullTrajectories
    got, waited = await asyncio.wait_for(held, 5.0)
    assert len(got.problems) == 2 and 0.25 < waited < 5.0 and samples[0] == 3


async def test_a_held_call_ends_paced_after_its_budget_below_the_calls_deadline():
    store = await _store(pace_batches=1, pace_batch_groups=1)
    gate = Pacing(store, wait_s=30.0)
    assert gate.budget(None) == 30.0 and gate.budget(100.0) == 30.0
    assert gate.budget(5.0) == pytest.approx(4.0) and gate.budget(0.5) == 0.0  # max(1 s, 20%) of the deadline kept
    await store.sample(1)
    t0 = time.monotonic()
    lease, waited = await gate.sample(1, None, "", "w", time_left=1.5)
    assert lease.paced and 0.4 < waited < 1.5 and time.monotonic() - t0 < 2.0
    assert gate.retry_after(waited) == 1.0 and gate.retry_after(1.0) == 0.0  # held a second: ask again at once


class _Signals:
    def __init__(self):
        self.n = 0

    async def signal(self):
        self.n += 1


@pytest.mark.parametrize(
    "result, outcomes, more_parts, wakes",
    [
        (ReportResult(True, groups_queued=3), 3, False, False),  # leased -> queued: no room made
        (ReportResult(True, groups_queued=2, groups_filtered=1), 3, False, True),  # a filtered group frees its place
        (ReportResult(True, groups_queued=0), 2, False, True),  # rewards only: nothing queued
        (ReportResult(True), 0, False, True),  # a lease handed back empty
        (ReportResult(True), 0, True, False),  # an empty part of a report: nothing freed
        (ReportResult(True, groups_queued=1, skipped=2), 3, False, False),  # a retried part: the rest applied before
        (ReportResult(True, groups_queued=2, quarantined=1), 3, False, True),
        (ReportResult(False, "expired"), 3, False, False),
    ],
)
async def test_a_report_wakes_the_held_calls_only_when_it_made_room(result, outcomes, more_parts, wakes):
    store = await _store(pace_batches=1)
    store.pace = _Signals()  # type: ignore[assignment]
    await Pacing(store).reported(result, outcomes, more_parts)
    assert store.pace.n == int(wakes)
    unpaced = await _store()
    unpaced.pace = _Signals()  # type: ignore[assignment]
    await Pacing(unpaced).reported(ReportResult(True, groups_filtered=3), 3, False)
    assert unpaced.pace.n == 0  # no bound, no wake-ups


async def test_a_declared_batch_over_the_servers_limit_is_refused():
    from prioreplay.errors import InvalidArgument

    gate = Pacing(await _store(pace_batches=1, max_batch_size=64))
    await gate.pulling(64)
    assert gate.store.pace.learner_batch == 64
    with pytest.raises(InvalidArgument, match=r"learner_batch_groups \(65\) must be <= 64"):
        await gate.pulling(65)
    assert gate.store.pace.learner_batch == 64  # refused: nothing recorded


async def test_dapos_filter_under_the_bound_never_queues_a_surplus_to_go_stale():
    """DAPO at generation (zero-variance groups filtered, their places leased again): with K = 1 the
    queue never holds more than one learner batch of mixed groups, so none waits a step longer."""
    import random

    store = await _store(pace_batches=1, pace_batch_groups=4)
    rng = random.Random(5)
    leases, most = [], 0
    for _ in range(300):
        if rng.random() < 0.5:
            lease = await store.sample(rng.randint(1, 6))
            if lease.lease_id:
                leases.append(lease)
        elif leases:
            lease = leases.pop(rng.randrange(len(leases)))
            rewards = [(0.0, 1.0), (1.0, 1.0), (0.0, 0.0)]
            await store.report(lease.lease_id, [GroupOutcome(s.problem.id, rng.choice(rewards), b"g") for s in lease.problems])
        if rng.random() < 0.1:
            await store.pull("L", 4)
        st = await store.stats()
        assert st.queue_depth + st.leased <= 4
        most = max(most, st.queue_depth)
    assert most == 4  # the bound was reached, never passed
