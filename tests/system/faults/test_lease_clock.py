"""Lease deadlines are read on Redis's clock, not on the clock of whichever replica answers
(docs/GUARANTEES.md, "One clock for leases"; issue 43, item 1), with real server processes.

Two ``prioreplay server`` replicas share one Redis namespace; the wall clock of one runs 20 s
ahead (``tests/support/skewed_clock.py``), as on a host whose NTP failed. Each leases with a 5 s
lease, shorter than the skew (the harshest case: with each replica's own clock, the fast one's
reaper expired the other's lease at once, and the slow one took a report of the fast one's 20 s
late). Both leases must get the deadline Redis's clock gives them, stay live until it, be expired
(by either reaper) only after it, and a report that comes later is refused as expired through
either replica.
"""

from __future__ import annotations

import time

import grpc
import pytest
import redis

from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import ServerProcess

#: How far the fast replica's wall clock runs ahead, seconds.
SKEW_S = 20.0
#: The lease both replicas hand out, seconds (below the skew).
LEASE_S = 5.0
#: Slack of the replicas' reapers (every 0.2 s) on a loaded machine, seconds.
REAP_SLACK_S = 3.0


def _redis_time(r: redis.Redis) -> float:
    sec, usec = r.time()
    return sec + usec / 1e6


def _lease(address: str, worker: str) -> pb.SampleProblemsResponse:
    with grpc.insecure_channel(address) as ch:
        return pb_grpc.PriorityServiceStub(ch).SampleProblems(
            pb.SampleProblemsRequest(batch_size=2, lease_timeout_s=LEASE_S, worker_id=worker), timeout=30
        )


def _report(address: str, lease: pb.SampleProblemsResponse, worker: str) -> pb.ReportOutcomesResponse:
    outcomes = [
        pb.ProblemOutcome(problem_id=p.problem.id, completions=[pb.Completion(reward=1.0), pb.Completion(reward=0.0)])
        for p in lease.problems
    ]
    with grpc.insecure_channel(address) as ch:
        return pb_grpc.PriorityServiceStub(ch).ReportOutcomes(
            pb.ReportOutcomesRequest(lease_id=lease.lease_id, outcomes=outcomes, worker_id=worker), timeout=30
        )


@pytest.mark.slow
def test_a_lease_lives_its_time_by_redis_clock_whichever_replica_leased_or_reaped_it(redis_url, namespace):
    flags = ("--store", redis_url, "--namespace", namespace, "--reaper-interval-s", "0.2")
    slow = ServerProcess(*flags)
    fast = ServerProcess(*flags, clock_skew_s=SKEW_S)
    r = redis.Redis.from_url(redis_url)
    deadlines_key = f"prioreplay:{{{namespace}}}:deadlines"
    try:
        slow.start()
        fast.start()
        with grpc.insecure_channel(slow.address) as ch:
            problems = [pb.Problem(id=f"p{i}", prompt=f"{i}+1", answer=str(i + 1)) for i in range(8)]
            pb_grpc.PriorityServiceStub(ch).RegisterProblems(iter([pb.RegisterProblemsRequest(problems=problems)]), timeout=30)

        before = _redis_time(r)
        on_slow, on_fast = _lease(slow.address, "a"), _lease(fast.address, "b")
        after = _redis_time(r)
        for lease in (on_slow, on_fast):  # now + 5 s by Redis's clock, whichever replica leased
            assert len(lease.problems) == 2
            assert before + LEASE_S - 0.01 <= lease.lease_deadline_unix_s <= after + LEASE_S + 0.01, (before, after, lease)
            assert r.zscore(deadlines_key, lease.lease_id) == pytest.approx(lease.lease_deadline_unix_s, abs=1e-6)

        # both stay live until their deadline (both reapers run every 0.2 s), and end after it
        last = max(on_slow.lease_deadline_unix_s, on_fast.lease_deadline_unix_s)
        while True:
            now, live = _redis_time(r), r.zcard(deadlines_key)
            if now < min(on_slow.lease_deadline_unix_s, on_fast.lease_deadline_unix_s) - 0.3:
                assert live == 2, f"a lease was expired {last - now:.1f} s before its deadline by Redis's clock"
            if live == 0:
                break
            assert now < last + REAP_SLACK_S, "a lease outlived its deadline by Redis's clock"
            time.sleep(0.05)
        assert now >= last - 0.05

        # a report after the deadline is refused through either replica
        for address, lease, worker in ((slow.address, on_fast, "b"), (fast.address, on_slow, "a")):
            answer = _report(address, lease, worker)
            assert not answer.accepted and answer.reason == "expired", answer
    finally:
        for s in (slow, fast):
            s.kill()
        r.close()
