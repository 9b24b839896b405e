"""A Redis that evicts is refused, never served (docs/GUARANTEES.md, "A Redis that evicts"; issue 43,
item 2), on real ``redis-server`` processes of this test alone (the shared Redis's policy is never
touched).

1. Under ``maxmemory-policy allkeys-lru`` ``prioreplay server`` does not start: exit 2, the policy
   and ``CONFIG SET maxmemory-policy noeviction`` named.
2. A server started under ``noeviction`` whose Redis is switched to ``allkeys-lru`` turns
   NOT_SERVING at its next health refresh, and every RPC answers UNAVAILABLE naming the policy and
   the fix. Another tenant then fills the memory until Redis evicts a key of the run's namespace;
   with the policy set back, the namespace is lost: FAILED_PRECONDITION on every RPC, never
   INTERNAL with a Lua type error; health stays NOT_SERVING; a restarted server refuses to start.
3. Which key LRU evicts first is Redis's choice; each key the namespace must hold (``stats``,
   ``settings``) deleted under a running server is the loss ``incomplete``, naming the key.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from prioreplay.errors import FailedPrecondition
from prioreplay.priority_server.background_server import BackgroundServer
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.open_store import create_store
from prioreplay.priority_server.store.identity import MUST_HOLD
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import REPO, cli, free_port, start_redis_server

NAMESPACE = "evict"
FIX = "CONFIG SET maxmemory-policy noeviction"
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def own_redis(request) -> Iterator[tuple[str, redis.Redis]]:
    """A redis-server of this test alone, 4 MB of memory and the policy ``request.param``: (url, client)."""
    workdir = tempfile.mkdtemp(prefix="prioreplay-evict-")
    port = free_port()
    proc = start_redis_server(port, workdir, False, "--maxmemory", "4mb", "--maxmemory-policy", request.param)
    r = redis.Redis.from_url(f"redis://127.0.0.1:{port}/0")
    yield f"redis://127.0.0.1:{port}/0", r
    r.close()
    proc.kill()
    proc.wait(10)
    shutil.rmtree(workdir, ignore_errors=True)


def _health(address: str) -> int:
    with grpc.insecure_channel(address) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def _refusal(address: str) -> grpc.RpcError:
    """The error SampleProblems answers (a lease answered instead fails the test)."""
    with grpc.insecure_channel(address) as ch:
        try:
            lease = pb_grpc.PriorityServiceStub(ch).SampleProblems(pb.SampleProblemsRequest(batch_size=4), timeout=10)
        except grpc.RpcError as e:
            return e
    pytest.fail(f"a lease of {len(lease.problems)} problem(s) was served")


def _wait(check, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s"
        time.sleep(0.05)


def _assert_lost(srv: BackgroundServer, config: ServerConfig, url: str, missing: str = "") -> None:
    """Every RPC answers FAILED_PRECONDITION (never a Lua type error, INTERNAL), naming ``missing``;
    health is NOT_SERVING; a restarted server refuses to start (the loss marker)."""
    e = _refusal(srv.address)
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
    assert "not the one this server was serving" in e.details() and missing in e.details(), e.details()
    with grpc.insecure_channel(srv.address) as ch:
        with pytest.raises(grpc.RpcError) as stats_error:
            pb_grpc.PriorityServiceStub(ch).GetStats(pb.GetStatsRequest(), timeout=10)
    assert stats_error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    time.sleep(0.3)  # several health refreshes
    assert _health(srv.address) == NOT_SERVING
    # a restart would otherwise write new settings and counters over the loss
    again = BackgroundServer(lambda: create_store(url, config.to_store_config(), namespace=config.namespace), config)
    with pytest.raises(FailedPrecondition, match="was lost while served"):
        again.start()


def _start(url: str, namespace: str) -> tuple[BackgroundServer, ServerConfig]:
    """A server (health refreshed every 0.1 s) holding 50 problems, 4 of them leased."""
    config = ServerConfig(store=url, namespace=namespace, stats_interval_s=0.1, reaper_interval_s=0.1, metrics_port=0)
    srv = BackgroundServer(lambda: create_store(url, config.to_store_config(), namespace=namespace), config).start()
    with grpc.insecure_channel(srv.address) as ch:
        stub = pb_grpc.PriorityServiceStub(ch)
        problems = [pb.Problem(id=f"p{i}", prompt=f"{i}+1", answer=str(i + 1)) for i in range(50)]
        stub.RegisterProblems(iter([pb.RegisterProblemsRequest(problems=problems)]), timeout=30)
        assert len(stub.SampleProblems(pb.SampleProblemsRequest(batch_size=4), timeout=10).problems) == 4
    return srv, config


@pytest.mark.parametrize("own_redis", ["allkeys-lru"], indirect=True)
@pytest.mark.parametrize("processes", [1, 2])
def test_a_server_does_not_start_on_a_redis_that_evicts(own_redis, processes):
    url, _ = own_redis
    r = subprocess.run(
        cli("server", store=url, namespace=NAMESPACE, port=free_port(), metrics_port=0, processes=processes),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert r.returncode == 2, r.stderr
    assert "maxmemory-policy 'allkeys-lru'" in r.stderr and FIX in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("own_redis", ["noeviction"], indirect=True)
def test_eviction_turned_on_later_is_not_served_and_evicted_keys_are_a_lost_namespace(own_redis):
    url, r = own_redis
    srv, config = _start(url, NAMESPACE)
    try:
        # the policy changed under a running server: NOT_SERVING, every RPC UNAVAILABLE with the fix
        r.config_set("maxmemory-policy", "allkeys-lru")
        _wait(lambda: _health(srv.address) == NOT_SERVING, "health NOT_SERVING")
        e = _refusal(srv.address)
        assert e.code() == grpc.StatusCode.UNAVAILABLE and "'allkeys-lru'" in e.details() and FIX in e.details(), e

        # another tenant fills the memory until Redis evicts a key of the namespace (which one: LRU's choice)
        keys = [f"prioreplay:{{{NAMESPACE}}}:{name}" for name in ("identity", *MUST_HOLD, "stats", "problems")]
        filler = b"x" * 10_000
        for i in range(20_000):
            r.set(f"tenant:{i}", filler)
            if i % 50 == 0 and r.exists(*keys) < len(keys):
                break
        assert r.exists(*keys) < len(keys), "Redis evicted none of the namespace's keys"
        r.config_set("maxmemory-policy", "noeviction")
        for k in r.scan_iter(match="tenant:*", count=1000):
            r.delete(k)

        # the policy set back: the namespace is lost (its identity or a key it must hold is gone)
        _wait(lambda: srv.store.namespace_lost is not None, "the namespace found lost")
        _assert_lost(srv, config, url)
    finally:
        srv.stop()


@pytest.mark.parametrize("key", ["stats", "settings"])
def test_a_key_the_namespace_must_hold_gone_is_a_lost_namespace_not_a_lua_type_error(redis_url, namespace, key):
    srv, config = _start(redis_url, namespace)
    try:
        with redis.Redis.from_url(redis_url) as r:
            r.delete(f"prioreplay:{{{namespace}}}:{key}")
        _assert_lost(srv, config, redis_url, f"but not its keys {key!r}")
    finally:
        srv.stop()
