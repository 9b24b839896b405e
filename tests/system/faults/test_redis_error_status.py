"""Redis failures injected on a real, test-owned ``redis-server``: every error kind has its status.

The mapping under test (docs/GUARANTEES.md, "Faults": Redis refuses writes or is unreachable): Redis unreachable, read-only (a
replica) or out of memory answers UNAVAILABLE (the client's :class:`StoreUnavailable`, retried
with backoff), the health status turns NOT_SERVING at once and back to SERVING when Redis
recovers, and nothing is lost; an answer the server cannot use (a logic error, e.g. a key of
another type) is INTERNAL with a log line, and health stays SERVING.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.convert import problem_to_proto
from prioreplay.errors import Internal, StoreUnavailable
from prioreplay.priority_server.background_server import BackgroundServer
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.open_store import create_store
from prioreplay.problems import ProblemRecord
from tests.conftest import free_port, start_redis_server

NAMESPACE = "faults"


@pytest.fixture
def own_redis():
    """A redis-server of this test alone (its settings are changed by the test): (url, port, workdir)."""
    workdir = tempfile.mkdtemp(prefix="prioreplay-faults-")
    port = free_port()
    proc = start_redis_server(port, workdir, appendonly=True)
    box = {"proc": proc}
    yield f"redis://127.0.0.1:{port}/0", port, workdir, box
    box["proc"].kill()
    box["proc"].wait(10)
    shutil.rmtree(workdir, ignore_errors=True)


def _server(url: str) -> BackgroundServer:
    config = ServerConfig(store=url, namespace=NAMESPACE, stats_interval_s=0.1, reaper_interval_s=0.1)
    return BackgroundServer(lambda: create_store(url, config.to_store_config(), namespace=NAMESPACE), config)


def _health(address: str) -> int:
    with grpc.insecure_channel(address) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def _wait_health(address: str, status: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _health(address) != status:
        assert time.monotonic() < deadline, f"health did not become {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}"
        time.sleep(0.05)


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _register(client: PriorityClient, n: int = 8) -> None:
    client.register([problem_to_proto(ProblemRecord(id=f"p{i}", prompt=f"{i}+1?", answer=str(i + 1))) for i in range(n)])


def _fault_round(url: str, inject, recover, what: str) -> None:
    """Inject a fault: writes answer UNAVAILABLE naming ``what`` and health turns NOT_SERVING; recover:
    SERVING again, and the state from before the fault is whole (8 problems, none leased)."""
    with _server(url) as srv, PriorityClient(ClientSettings(server=srv.address, rpc_timeout_s=5), max_retries=0) as c:
        _register(c)
        _wait_health(srv.address, SERVING)
        inject()
        with pytest.raises(StoreUnavailable) as e:
            c.sample(4)
        assert what in str(e.value), str(e.value)
        _wait_health(srv.address, NOT_SERVING, timeout_s=2.0)
        recover()
        _wait_health(srv.address, SERVING)
        s = c.stats()
        assert (s.problems, s.leased, s.active_leases) == (8, 0, 0)  # the failed sample changed nothing
        assert len(c.sample(4).problems) == 4
        text = srv.runtime.metrics.render().decode()
        assert "prioreplay_store_errors_total{" in text and what.replace(" ", "_") in text


def test_out_of_memory_is_unavailable_and_not_serving_until_memory_is_back(own_redis):
    url, _, _, _ = own_redis
    r = redis.Redis.from_url(url)
    _fault_round(url, lambda: r.config_set("maxmemory", 1), lambda: r.config_set("maxmemory", 0), "out of memory")


def test_a_read_only_replica_is_unavailable_and_not_serving_until_it_is_a_primary(own_redis):
    url, _, _, _ = own_redis
    r = redis.Redis.from_url(url)
    nowhere = free_port()  # a primary that never answers: the replica keeps its data and refuses writes
    _fault_round(url, lambda: r.replicaof("127.0.0.1", nowhere), lambda: r.replicaof("NO", "ONE"), "read only")


def test_a_killed_redis_is_unavailable_and_not_serving_until_it_restarts(own_redis):
    url, port, workdir, box = own_redis

    def kill():
        box["proc"].kill()
        box["proc"].wait(10)

    _fault_round(url, kill, lambda: box.update(proc=start_redis_server(port, workdir, appendonly=True)), "unreachable")


def test_a_logic_error_is_internal_with_a_log_line_and_health_stays_serving(own_redis, caplog):
    url, _, _, _ = own_redis
    r = redis.Redis.from_url(url)
    with (
        _server(url) as srv,
        PriorityClient(ClientSettings(server=srv.address, rpc_timeout_s=5), max_retries=3, backoff_s=0.01) as c,
    ):
        _register(c)
        heap = srv.store.key("heap")
        r.delete(heap)
        r.set(heap, "not a sorted set")  # WRONGTYPE for every heap command: a bug, not an outage
        with caplog.at_level(logging.ERROR), pytest.raises(Internal) as e:
            c.sample(4)
        assert "WRONGTYPE" in str(e.value) or "see the server log" in str(e.value)
        assert any("WRONGTYPE" in rec.getMessage() for rec in caplog.records), caplog.text
        time.sleep(0.3)  # a few health refreshes
        assert _health(srv.address) == SERVING
