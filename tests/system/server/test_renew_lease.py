"""RenewLease through gRPC over each store: the status codes of the proto, and the lease kept past
its first deadline. The server's store runs on a fake clock, so nothing here sleeps."""

from __future__ import annotations

import grpc
import pytest

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.errors import FailedPrecondition, InvalidArgument, NotFound
from prioreplay.priority_server.background_server import BackgroundServer
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.open_store import create_store
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.support.store_semantics import FakeClock


def server_config() -> ServerConfig:
    """No retests (every batch is the heap's top); leases of at most an hour; no reaper sweep while
    the test runs (the fake clock decides when a lease is due)."""
    return ServerConfig(
        store="memory",
        metrics_port=0,
        snapshot_interval_s=0,
        retest_fraction=0.0,
        max_lease_timeout_s=3600,
        reaper_interval_s=3600,
    )


@pytest.fixture(params=["memory", "redis"])
def served(request, redis_url, namespace):
    """(client, clock) of a server over each store whose clock is a :class:`FakeClock`."""
    cfg = server_config()
    clock = FakeClock()
    spec = "memory" if request.param == "memory" else redis_url
    with BackgroundServer(lambda: create_store(spec, cfg.to_store_config(), clock=clock, namespace=namespace), cfg) as srv:
        client = PriorityClient(ClientSettings(server=srv.address), max_retries=0)
        problems = [pb.Problem(id=f"p{i}", prompt=f"{i} + 1 =", answer=str(i + 1)) for i in range(6)]
        client.register(problems)
        yield client, clock
        client.close()


def _code(client: PriorityClient, request: pb.RenewLeaseRequest) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        pb_grpc.PriorityServiceStub(client.channel).RenewLease(request, timeout=10)
    return e.value.code(), e.value.details()


def test_renew_keeps_a_lease_past_its_first_deadline(served):
    client, clock = served
    lease = client.sample(4, worker_id="w1", lease_timeout_s=10)
    clock.advance(8)
    renewed = client.renew(lease.lease_id, worker_id="w1", lease_timeout_s=10)
    assert (renewed.lease_deadline_unix_s, renewed.problems) == (clock.t + 10, 4)
    clock.advance(5)  # past the first deadline: sampling reaps due leases, and this one is not due
    assert len(client.sample(6, worker_id="w2").problems) == 2
    assert client.stats().leased == 6
    done = client.report(
        lease.lease_id,
        [pb.ProblemOutcome(problem_id=lp.problem.id, completions=[pb.Completion(reward=1.0)]) for lp in lease.problems],
    )
    assert done.accepted


def test_renew_refusals_have_the_documented_status_codes(served):
    client, clock = served
    lease = client.sample(2, worker_id="w1", lease_timeout_s=10)
    code, details = _code(client, pb.RenewLeaseRequest(lease_id="0" * 32, worker_id="w1", lease_timeout_s=10))
    assert code == grpc.StatusCode.NOT_FOUND and "unknown lease" in details and "0" * 32 in details
    code, details = _code(client, pb.RenewLeaseRequest(lease_id=lease.lease_id, worker_id="w2", lease_timeout_s=10))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "'w1'" in details and "'w2'" in details
    code, details = _code(client, pb.RenewLeaseRequest(lease_id=lease.lease_id, worker_id="w1", lease_timeout_s=3601))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "--max-lease-timeout-s" in details
    code, details = _code(client, pb.RenewLeaseRequest(lease_id="", worker_id="w1"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "lease_id is empty" in details
    code, _ = _code(client, pb.RenewLeaseRequest(lease_id=lease.lease_id, worker_id="w" * 129))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    # the client maps them back to the domain errors
    with pytest.raises(FailedPrecondition):
        client.renew(lease.lease_id, worker_id="w2")
    with pytest.raises(InvalidArgument):
        client.renew(lease.lease_id, worker_id="w1", lease_timeout_s=-1)
    clock.advance(10)  # due: expired by the renew itself
    with pytest.raises(NotFound, match=rf"lease {lease.lease_id} cannot be renewed: expired"):
        client.renew(lease.lease_id, worker_id="w1")
    st = client.stats()
    assert (st.leased, st.lease_expiries) == (0, 1)
