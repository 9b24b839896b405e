"""Retried SampleProblems: a client request id makes a retry get the lease the first attempt made.

The input from the issue: a slow answer with ``rpc_timeout_s`` 1 and 3 retries left 4 leases and
32 problems held for ``lease_timeout_s``; with the request id it leaves one lease of 8.
"""

from __future__ import annotations

import asyncio

import pytest

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.convert import problem_to_proto
from prioreplay.priority_server.background_server import BackgroundServer
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.open_store import create_store
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.problems import ProblemRecord


def _problems(n: int) -> list[ProblemRecord]:
    return [ProblemRecord(id=f"p{i}", prompt=f"{i}+1?", answer=str(i + 1)) for i in range(n)]


class SlowFirstSamples:
    """A store whose first ``slow`` samples answer after ``delay_s`` (the lease is made at once)."""

    def __init__(self, inner, slow: int, delay_s: float):
        self.inner, self.slow, self.delay_s = inner, slow, delay_s

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def sample(self, *args, **kwargs):
        lease = await self.inner.sample(*args, **kwargs)
        if self.slow > 0:
            self.slow -= 1
            await asyncio.sleep(self.delay_s)  # the client's deadline passes: it retries
        return lease


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_sample_retried_after_its_deadline_leaves_one_lease(kind, redis_url, namespace):
    spec = "memory" if kind == "memory" else redis_url
    config = ServerConfig(snapshot_interval_s=0)

    def factory():
        return SlowFirstSamples(create_store(spec, StoreConfig(retest_fraction=0.0), namespace=namespace), slow=3, delay_s=1.5)

    with (
        BackgroundServer(factory, config) as srv,
        PriorityClient(ClientSettings(server=srv.address, rpc_timeout_s=1), max_retries=3, backoff_s=0.01) as c,
    ):
        c.register([problem_to_proto(p) for p in _problems(40)])
        lease = c.sample(8, worker_id="w1")
        assert len(lease.problems) == 8
        s = c.stats()
        assert (s.active_leases, s.leased) == (1, 8), "each retry made a lease of its own"
        assert c.report(lease.lease_id, []).accepted  # the lease the client holds is the live one


async def test_the_same_request_id_gets_the_same_live_lease_in_both_stores(store_factory):
    t = [1000.0]
    store = store_factory(StoreConfig(retest_fraction=0.0, lease_timeout_s=10), clock=lambda: t[0])
    await store.register(_problems(10))
    first = await store.sample(4, request_id="w1\tr1")
    again = await store.sample(4, request_id="w1\tr1")
    assert again == first  # same id, deadline, problems, priorities, step, policy
    other = await store.sample(4, request_id="w2\tr1")  # another client's id: a lease of its own
    assert other.lease_id != first.lease_id and {p.problem.id for p in other.problems}.isdisjoint(
        {p.problem.id for p in first.problems}
    )
    short = await store.sample(4, request_id="w1\tr2")  # 2 left: a short batch, replayed short
    assert len(short.problems) == 2 and short.retry_after_s > 0
    assert await store.sample(4, request_id="w1\tr2") == short
    stats = await store.stats()
    assert (stats.active_leases, stats.leased, stats.step) == (3, 10, 3)

    # a reported lease is not live: the id leases anew
    await store.report(first.lease_id, [GroupOutcome(p.problem.id, (1.0, 0.0)) for p in first.problems])
    fresh = await store.sample(2, request_id="w1\tr1")
    assert fresh.lease_id not in ("", first.lease_id) and len(fresh.problems) == 2
    # an expired lease neither
    t[0] += 11.0
    after = await store.sample(2, request_id="w1\tr2")
    assert after.lease_id != short.lease_id
    with pytest.raises(Exception, match="request_id is 300 bytes"):
        await store.sample(1, request_id="x" * 300)


# -- backpressure: leases refused while the trajectory queue is over its bound ------------------------
@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_leases_are_refused_with_a_retry_hint_while_the_queue_is_over_its_bound(kind, redis_url, namespace):
    from prioreplay.v1 import priority_service_pb2 as pb

    spec = "memory" if kind == "memory" else redis_url
    config = ServerConfig(snapshot_interval_s=0, max_queue_depth=3, backpressure_retry_s=0.5, retest_fraction=0.0)

    def factory():
        return create_store(spec, config.to_store_config(), namespace=namespace)

    with BackgroundServer(factory, config) as srv, PriorityClient(ClientSettings(server=srv.address), max_retries=0) as c:
        c.register([problem_to_proto(p) for p in _problems(20)])
        mixed = [pb.Completion(reward=r, token_ids=[1], logprobs=[-0.5]) for r in (1.0, 0.0)]

        def lease_and_report(n: int) -> None:
            lease = c.sample(n)
            assert len(lease.problems) == n and not lease.backpressure
            outs = [pb.ProblemOutcome(problem_id=lp.problem.id, completions=mixed) for lp in lease.problems]
            assert c.report(lease.lease_id, outs).groups_queued == n

        lease_and_report(2)  # queue depth 2 < 3: still served
        lease_and_report(2)  # depth 4 >= 3
        refused = c.sample(4)
        assert (len(refused.problems), refused.lease_id, refused.backpressure) == (0, "", True)
        assert refused.retry_after_s == pytest.approx(0.5)
        assert c.stats().leased == 0  # nothing was leased
        text = srv.runtime.metrics.render().decode()
        assert "prioreplay_backpressure_refusals_total 1.0" in text

        pulled = c.pull(4, consumer="L")  # the learner catches up: the queue drains
        assert len(pulled.groups) == 4
        lease = c.sample(4)
        assert len(lease.problems) == 4 and not lease.backpressure


# -- quarantine: problems reported unservable are never served until registered again ---------------
async def test_unservable_problems_are_quarantined_until_registered_again_in_both_stores(store_factory):
    from prioreplay.errors import InvalidArgument
    from prioreplay.rules import Pool

    store = store_factory(StoreConfig(retest_fraction=0.0))
    await store.register(_problems(6))
    lease = await store.sample(3)
    ids = [p.problem.id for p in lease.problems]
    with pytest.raises(InvalidArgument, match="not in lease"):
        await store.report(lease.lease_id, [], unservable=["p-unknown"])
    with pytest.raises(InvalidArgument, match="twice"):
        await store.report(lease.lease_id, [GroupOutcome(ids[0], (1.0, 0.0))], unservable=[ids[0]])
    before = await store.problem_state(ids[1])
    res = await store.report(lease.lease_id, [GroupOutcome(ids[0], (1.0, 0.0))], unservable=[ids[1]])
    assert res.accepted and res.quarantined == 1
    st = await store.problem_state(ids[1])
    assert st.pool is Pool.QUARANTINED and st.stats == before.stats and st.score == before.score
    s = await store.stats()
    assert (s.quarantined, s.leased, s.heap_size) == (1, 0, 5)
    served = set()
    for _ in range(4):  # the heap is drained again and again: the quarantined one never comes
        more = await store.sample(6)
        served |= {p.problem.id for p in more.problems}
        await store.report(more.lease_id, [])
    assert ids[1] not in served and len(served) == 5
    await store.register(_problems(6))  # registered again (e.g. with a shorter prompt)
    st = await store.problem_state(ids[1])
    assert st.pool is Pool.HEAP and st.score == before.score and st.stats == before.stats
    assert (await store.stats()).quarantined == 0
    assert ids[1] in {p.problem.id for p in (await store.sample(6)).problems}
