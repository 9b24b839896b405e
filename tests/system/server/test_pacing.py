"""The pace bound over gRPC, on both stores: a lease that finds no room waits for the learner and
is woken by what makes room (a pull, a filtered report, an expiry), never polled; after its wait it
answers ``paced``; two replicas on one Redis wake each other's waiting calls.

"Never polled" is counted: every ``Store.sample`` the server runs is tallied, and a held call runs
exactly two (the one that found no room, the one after taking its wake-up mark) until woken.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.convert import problem_to_proto
from prioreplay.priority_server.background_server import BackgroundServer
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.open_store import create_store
from prioreplay.problems import ProblemRecord
from prioreplay.v1 import priority_service_pb2 as pb

MIXED = (1.0, 0.0)
SOLVED = (1.0, 1.0)


def _config(**kw) -> ServerConfig:
    base = dict(snapshot_interval_s=0, retest_fraction=0.0, pace_batches=1, pace_batch_groups=2, pace_wait_s=20.0)
    return ServerConfig(**{**base, **kw})


@contextlib.contextmanager
def _server(kind: str, redis_url: str, namespace: str, config: ServerConfig):
    spec = "memory" if kind == "memory" else redis_url
    with BackgroundServer(lambda: create_store(spec, config.to_store_config(), namespace=namespace), config) as srv:
        yield srv


def _count_samples(srv: BackgroundServer) -> list[int]:
    """Tally every ``Store.sample`` the server runs (what a polling wait would repeat)."""
    calls = [0]
    sample = srv.store.sample

    async def counted(*a, **kw):
        calls[0] += 1
        return await sample(*a, **kw)

    srv.store.sample = counted
    return calls


def _report(c: PriorityClient, lease, rewards=MIXED) -> pb.ReportOutcomesResponse:
    comps = [pb.Completion(reward=r, token_ids=[1], logprobs=[-0.5]) for r in rewards]
    outs = [pb.ProblemOutcome(problem_id=lp.problem.id, completions=comps) for lp in lease.problems]
    return c.report(lease.lease_id, outs)


class Held:
    """One SampleProblems on its own thread (the server holds it); ``result`` after ``join``."""

    def __init__(self, c: PriorityClient, batch: int):
        self.result: pb.SampleProblemsResponse | None = None
        self.returned_at = 0.0
        self._thread = threading.Thread(target=self._run, args=(c, batch), daemon=True)
        self._thread.start()

    def _run(self, c, batch):
        self.result = c.sample(batch)
        self.returned_at = time.monotonic()

    def join(self, timeout: float = 15.0) -> pb.SampleProblemsResponse:
        self._thread.join(timeout)
        assert self.result is not None, "the held lease never answered"
        return self.result


def _client(srv: BackgroundServer) -> PriorityClient:
    return PriorityClient(ClientSettings(server=srv.address), max_retries=0)


def _problems(n: int) -> list[pb.Problem]:
    return [problem_to_proto(ProblemRecord(f"p{i:03d}", f"{i} + 1 = ?", str(i + 1))) for i in range(n)]


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_lease_waits_for_the_learners_pull_and_is_woken_by_it_not_polled(kind, redis_url, namespace):
    with _server(kind, redis_url, namespace, _config()) as srv, _client(srv) as c:
        c.register(_problems(10))
        first = c.sample(3)  # K x b = 1 x 2: the bound cuts the batch to the room
        assert len(first.problems) == 2 and first.pace_wait_s == 0
        assert _report(c, first).groups_queued == 2  # leased -> queued: still 2 ahead, no room
        calls = _count_samples(srv)
        held = Held(c, 2)
        time.sleep(1.0)  # a polling wait would sample many times by now
        assert held.result is None and calls[0] == 2
        pulled_at = time.monotonic()
        assert len(c.pull(2, consumer="L", batch_groups=2).groups) == 2  # the learner catches up
        lease = held.join()
        assert len(lease.problems) == 2 and not lease.paced
        assert 0.9 < lease.pace_wait_s < 10.0 and held.returned_at - pulled_at < 5.0  # woken, far below pace_wait_s
        assert calls[0] == 3
        text = srv.runtime.metrics.render().decode()
        assert "prioreplay_pace_wait_seconds_count 1.0" in text
        assert "prioreplay_pace_bound_groups 2.0" in text


def test_the_redis_wake_up_outlasts_the_command_reply_timeout(redis_url, namespace, monkeypatch):
    """The listener's XREAD BLOCK runs on the blocking client: on the command client its block would
    outlast the reply time-out, fail, and wake every held call to sample again (a poll)."""
    from prioreplay.priority_server.store.redis import connection

    monkeypatch.setattr(connection, "SOCKET_TIMEOUT_S", 0.3)  # the command client's reply time-out
    with _server("redis", redis_url, namespace, _config()) as srv, _client(srv) as c:
        c.register(_problems(10))
        _report(c, c.sample(2))  # 2 queued fill the bound
        calls = _count_samples(srv)
        held = Held(c, 2)
        time.sleep(1.5)  # five reply time-outs
        assert held.result is None and calls[0] == 2  # sampled, took a mark, sampled again: then waited
        assert len(c.pull(2, consumer="L", batch_groups=2).groups) == 2
        assert len(held.join().problems) == 2 and calls[0] == 3


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_held_call_answers_paced_after_its_wait_and_the_worker_asks_again_at_once(kind, redis_url, namespace):
    with _server(kind, redis_url, namespace, _config(pace_wait_s=1.0)) as srv, _client(srv) as c:
        c.register(_problems(10))
        assert len(c.sample(2).problems) == 2  # never reported: 2 in flight fill the bound
        t0 = time.monotonic()
        answer = c.sample(2)
        assert (answer.paced, len(answer.problems), answer.lease_id, answer.retry_after_s) == (True, 0, "", 0.0)
        assert 1.0 <= answer.pace_wait_s < 3.0 and time.monotonic() - t0 >= 1.0
        assert c.stats().leased == 2  # nothing more was leased


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_filtered_report_makes_room_and_wakes_the_held_lease(kind, redis_url, namespace):
    """DAPO's rule at generation: a zero-variance group is not queued, so its problem's place is
    leased again at once, until a learner batch of mixed groups is queued."""
    with _server(kind, redis_url, namespace, _config()) as srv, _client(srv) as c:
        c.register(_problems(10))
        first = c.sample(2)
        calls = _count_samples(srv)
        held = Held(c, 2)
        time.sleep(0.5)
        assert held.result is None and calls[0] == 2
        assert _report(c, first, SOLVED).groups_filtered == 2
        lease = held.join()
        assert len(lease.problems) == 2 and calls[0] == 3


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_an_expiring_lease_makes_room_for_the_held_one(kind, redis_url, namespace):
    with _server(kind, redis_url, namespace, _config()) as srv, _client(srv) as c:
        c.register(_problems(10))
        assert len(c.sample(2, lease_timeout_s=1.0).problems) == 2  # a worker that dies with its lease
        t0 = time.monotonic()
        lease = c.sample(2)
        assert len(lease.problems) == 2 and 0.9 < time.monotonic() - t0 < 8.0  # at the expiry, not at pace_wait_s
        assert c.stats().lease_expiries == 1


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_the_learners_declared_batch_sets_the_bound(kind, redis_url, namespace):
    with _server(kind, redis_url, namespace, _config(pace_batches=2, pace_wait_s=1.0)) as srv, _client(srv) as c:
        c.register(_problems(20))
        assert len(c.sample(8).problems) == 4  # before any pull: K x --pace-batch-groups = 2 x 2
        assert c.pull(1, consumer="L", batch_groups=5).groups == []  # the learner declares 5 groups a step
        assert len(c.sample(8).problems) == 6  # 2 x 5 - 4 in flight
        assert c.sample(1).paced
        text = srv.runtime.metrics.render().decode()
        assert "prioreplay_pace_bound_groups 10.0" in text
        with pytest.raises(Exception, match="learner_batch_groups"):
            c.pull(1, consumer="L", batch_groups=10**6)


def test_a_pull_through_one_replica_wakes_a_lease_held_by_another(redis_url, namespace):
    """Two servers on one Redis namespace: the wake-up is a stream every replica's waiting calls
    block on, so a learner pulling from replica B frees the worker held by replica A."""
    config = _config()
    with (
        _server("redis", redis_url, namespace, config) as a,
        _server("redis", redis_url, namespace, config) as b,
        _client(a) as ca,
        _client(b) as cb,
    ):
        ca.register(_problems(10))
        first = ca.sample(2)
        assert _report(ca, first).groups_queued == 2
        calls = _count_samples(a)
        held = Held(ca, 2)
        time.sleep(1.0)
        assert held.result is None and calls[0] == 2
        pulled_at = time.monotonic()
        assert len(cb.pull(2, consumer="L", batch_groups=2).groups) == 2
        lease = held.join()
        assert len(lease.problems) == 2 and held.returned_at - pulled_at < 5.0 and calls[0] == 3


def test_without_a_pace_bound_nothing_waits(redis_url, namespace):
    with _server("memory", redis_url, namespace, _config(pace_batches=0)) as srv, _client(srv) as c:
        c.register(_problems(10))
        assert [len(c.sample(4).problems) for _ in range(3)] == [4, 4, 2]
        assert "prioreplay_pace_bound_groups 0.0" in srv.runtime.metrics.render().decode()
