"""Every RPC with empty, zero, negative, huge, NaN and mismatched arguments, over gRPC.

Each refused request must answer the status code the proto documents, with a message, and leave
the store exactly as it was (``Store.dump()`` before == after), on both stores. The cases are
tests/support/rpc_cases.py; tests/unit/server/test_servicer_validation.py hands the same cases to the servicer
in-process (no Redis, no server). Here the transport's limits (RESOURCE_EXHAUSTED) and the Redis
store's own checks are covered too.
"""

from __future__ import annotations

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from prioreplay.errors import NotFound
from prioreplay.priority_server.background_server import BackgroundServer
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.open_store import create_store
from prioreplay.priority_server.store.memory_store import MemoryStore
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import free_port
from tests.support.rpc_cases import INVALID, MAX_BATCH, MAX_LEASE_S, bad_request_cases, group, problem


def server_config() -> ServerConfig:
    # a 1 MiB message limit and small batch / lease limits make "huge" cheap to send
    return ServerConfig(
        metrics_port=0,
        max_message_mb=1,
        max_batch_size=MAX_BATCH,
        lease_timeout_s=600,
        max_lease_timeout_s=MAX_LEASE_S,
        reaper_interval_s=0.5,
        stats_interval_s=0.5,
        snapshot_interval_s=0,
    )


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(server.address) as ch:
        yield pb_grpc.PriorityServiceStub(ch)


def _seed_state(stub) -> tuple[pb.SampleProblemsResponse, list[str]]:
    """20 problems, one reported lease (a queued group), one live lease, a published policy."""
    stub.RegisterProblems(iter([pb.RegisterProblemsRequest(problems=[problem(i) for i in range(20)])]), timeout=10)
    first = stub.SampleProblems(pb.SampleProblemsRequest(batch_size=3), timeout=10)
    outs = [pb.ProblemOutcome(problem_id=lp.problem.id, completions=group()) for lp in first.problems]
    assert stub.ReportOutcomes(pb.ReportOutcomesRequest(lease_id=first.lease_id, outcomes=outs), timeout=10).accepted
    stub.PublishPolicy(pb.PublishPolicyRequest(version=2, weights_uri="ckpt/step-2"), timeout=10)
    live = stub.SampleProblems(pb.SampleProblemsRequest(batch_size=4), timeout=10)
    leased = [lp.problem.id for lp in live.problems]
    return live, leased


def _call(stub, method: str, request):
    fn = getattr(stub, method)
    if method == "RegisterProblems":
        return fn(iter(request), timeout=10)
    return fn(request, timeout=10)


def test_bad_requests_are_refused_and_change_nothing(server, stub):
    live, leased = _seed_state(stub)
    other = next(f"p{i}" for i in range(20) if f"p{i}" not in leased)
    cases = bad_request_cases(live, leased, other)
    assert len({name for name, *_ in cases}) == len(cases)
    wrong = []
    for name, method, request, code in cases:
        before = server.call(server.store.dump())
        try:
            _call(stub, method, request)
            wrong.append(f"{name}: accepted, expected {code.name}")
            continue
        except grpc.RpcError as e:
            if e.code() != code or not e.details():
                wrong.append(f"{name}: {e.code().name} {e.details()!r}, expected {code.name}")
        if server.call(server.store.dump()) != before:
            wrong.append(f"{name}: the store changed")
    assert not wrong, "\n".join(wrong)
    # the live lease is still reportable after all those refusals
    outs = [pb.ProblemOutcome(problem_id=pid, completions=group()) for pid in leased]
    assert stub.ReportOutcomes(pb.ReportOutcomesRequest(lease_id=live.lease_id, outcomes=outs), timeout=10).accepted


def test_accepted_oddities_change_only_what_they_should(server, stub):
    """Requests the proto answers without an error: no-ops, counted unknowns, idempotent repeats."""
    live, leased = _seed_state(stub)
    before = server.call(server.store.dump())

    # empty stream, empty chunk: nothing registered, total reported
    resp = stub.RegisterProblems(iter([pb.RegisterProblemsRequest()]), timeout=10)
    assert (resp.created, resp.updated, resp.total) == (0, 0, 20)
    # unknown / empty / many garbage ids: counted as unknown
    garbage = ["", "0-0", "not-an-id"] + [f"{i}-{i}" for i in range(5000)]
    ack = stub.AckTrajectories(pb.AckTrajectoriesRequest(group_ids=garbage), timeout=10)
    assert (ack.acked, ack.unknown) == (0, len(garbage))
    assert stub.AckTrajectories(pb.AckTrajectoriesRequest(), timeout=10).acked == 0
    # the same policy again: idempotent
    pub = stub.PublishPolicy(pb.PublishPolicyRequest(version=2, weights_uri="ckpt/step-2"), timeout=10)
    assert (pub.version, pub.weights_uri) == (2, "ckpt/step-2")
    # 0 buckets means 10
    assert len(stub.GetStats(pb.GetStatsRequest(), timeout=10).priority_histogram) == 10
    assert server.call(server.store.dump()) == before

    # an unknown lease: accepted = false, only late_reports moves
    rep = stub.ReportOutcomes(
        pb.ReportOutcomesRequest(lease_id="f" * 32, outcomes=[pb.ProblemOutcome(problem_id=leased[0], completions=group())]),
        timeout=10,
    )
    assert (rep.accepted, rep.reason) == (False, "unknown lease")
    after = server.call(server.store.dump())
    assert after["counters"]["late_reports"] == before["counters"]["late_reports"] + 1
    after["counters"]["late_reports"] -= 1
    assert after == before


def test_a_bad_chunk_keeps_the_chunks_before_it(server, stub):
    chunks = [
        pb.RegisterProblemsRequest(problems=[problem(i) for i in range(5)]),
        pb.RegisterProblemsRequest(problems=[problem(5), problem(6, prompt="")]),
    ]
    with pytest.raises(grpc.RpcError) as e:
        stub.RegisterProblems(iter(chunks), timeout=10)
    assert e.value.code() == INVALID
    assert "problem #6" in e.value.details()  # the index in the whole stream
    assert set(server.call(server.store.dump())["problems"]) == {f"p{i}" for i in range(5)}


def test_unreachable_redis_answers_unavailable(redis_url, namespace):
    cfg = server_config()
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with (
        BackgroundServer(lambda: create_store(dead, cfg.to_store_config(), namespace=namespace), cfg) as s,
        grpc.insecure_channel(s.address) as ch,
    ):
        stub = pb_grpc.PriorityServiceStub(ch)
        for method, req in (("SampleProblems", pb.SampleProblemsRequest(batch_size=1)), ("GetStats", pb.GetStatsRequest())):
            with pytest.raises(grpc.RpcError) as e:
                getattr(stub, method)(req, timeout=20)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, method
            assert "unreachable" in e.value.details()
        status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING


class _FaultyStore(MemoryStore):
    """A memory store whose sample fails on purpose (to check the servicer's error mapping)."""

    error: Exception = NotFound("problem 'x' vanished")

    async def _sample(self, batch_size, lease_timeout_s, request_id="", worker_id=""):
        raise self.error


@pytest.mark.parametrize(
    "error,code",
    [(NotFound("problem 'x' vanished"), grpc.StatusCode.NOT_FOUND), (RuntimeError("secret internals"), grpc.StatusCode.INTERNAL)],
)
def test_domain_errors_map_to_status_codes(error, code):
    cfg = server_config()
    store_cls = type("Faulty", (_FaultyStore,), {"error": error})
    with BackgroundServer(lambda: store_cls(cfg.to_store_config()), cfg) as s, grpc.insecure_channel(s.address) as ch:
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.PriorityServiceStub(ch).SampleProblems(pb.SampleProblemsRequest(batch_size=1), timeout=10)
        assert e.value.code() == code
        if code == grpc.StatusCode.NOT_FOUND:
            assert e.value.details() == "problem 'x' vanished"
        else:
            assert "secret internals" not in e.value.details()
        # the interceptor records after the status went out: give it a moment
        line = f'prioreplay_rpc_errors_total{{code="{code.name}",method="SampleProblems"}} 1.0'
        deadline = time.monotonic() + 5
        while line not in s.runtime.metrics.render().decode() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert line in s.runtime.metrics.render().decode()
