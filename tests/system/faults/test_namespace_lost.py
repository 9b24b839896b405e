"""A run namespace that vanishes is an error, not a fresh start (docs/GUARANTEES.md, "A namespace that
vanishes"; issue 34, item 3), against real Redis.

Each loss is made for real: an empty ``redis-server`` started behind the port the server uses (what a
promoted replica that never received the data set looks like), ``FLUSHDB`` on a test-owned
``redis-server``, and the keys of an older generation put back with ``DUMP``/``RESTORE`` (a restore of
an older snapshot) in a namespace of its own on the shared Redis. Each time the server turns
NOT_SERVING, every RPC answers FAILED_PRECONDITION naming what was lost and both ways out, the loss is
counted in ``prioreplay_namespace_lost`` / ``prioreplay_namespace_losses_total``, and no lease (an
empty one least of all) is served. Then each way out: the data restored (the servers serve again by
themselves) and ``--accept-namespace-loss`` (a new generation; the running servers follow it).
"""

from __future__ import annotations

import shutil
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.convert import problem_to_proto
from prioreplay.errors import FailedPrecondition, StoreUnavailable
from prioreplay.priority_server.background_server import BackgroundServer
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.open_store import create_store
from prioreplay.priority_server.store.identity import ACCEPT_FLAG, RUNBOOK, Identity, LossMarker
from prioreplay.problems import ProblemRecord
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import free_port, start_redis_server

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def own_redis() -> Iterator[tuple[str, int, str, dict]]:
    """A redis-server of this test alone, no persistence (it is flushed or replaced): (url, port, workdir, box)."""
    workdir = tempfile.mkdtemp(prefix="prioreplay-nsid-")
    port = free_port()
    box = {"proc": start_redis_server(port, workdir)}
    yield f"redis://127.0.0.1:{port}/0", port, workdir, box
    box["proc"].kill()
    box["proc"].wait(10)
    shutil.rmtree(workdir, ignore_errors=True)


def _server(url: str, ns: str, accept_loss: bool = False) -> BackgroundServer:
    config = ServerConfig(store=url, namespace=ns, stats_interval_s=0.1, reaper_interval_s=0.1, accept_namespace_loss=accept_loss)
    return BackgroundServer(lambda: create_store(url, config.to_store_config(), namespace=ns), config)


def _client(srv: BackgroundServer) -> PriorityClient:
    return PriorityClient(ClientSettings(server=srv.address, rpc_timeout_s=5), max_retries=0)


def _health(address: str) -> int:
    with grpc.insecure_channel(address) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def _wait(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s"
        time.sleep(0.05)


def _register(c: PriorityClient, n: int = 8, tag: str = "p") -> None:
    c.register([problem_to_proto(ProblemRecord(id=f"{tag}{i}", prompt=f"{i}+1?", answer=str(i + 1))) for i in range(n)])


def _outcome(lease: pb.SampleProblemsResponse) -> list[pb.ProblemOutcome]:
    comps = [pb.Completion(reward=r, text="7") for r in (0.0, 1.0)]
    return [pb.ProblemOutcome(problem_id=lp.problem.id, completions=comps, prompt_token_ids=[8, 9]) for lp in lease.problems]


def _refused(c: PriorityClient, timeout_s: float = 10.0) -> FailedPrecondition:
    """Sample until the server answers FAILED_PRECONDITION (UNAVAILABLE while Redis is being swapped is
    retried); a lease answered instead fails the test: nothing may be served from a lost namespace."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            lease = c.sample(4)
        except StoreUnavailable:
            assert time.monotonic() < deadline, "the server kept answering UNAVAILABLE"
            time.sleep(0.05)
            continue
        except FailedPrecondition as e:
            return e
        pytest.fail(f"a lease with {len(lease.problems)} problem(s) was served from a lost namespace")


def _assert_lost(
    srv: BackgroundServer, c: PriorityClient, found: str, lease: pb.SampleProblemsResponse | None = None, losses: int = 1
) -> None:
    """The server is NOT_SERVING, and every RPC answers FAILED_PRECONDITION naming the loss (``found``:
    what the message says the namespace holds) and both ways out; ``losses`` losses counted so far."""
    err = _refused(c)
    msg = str(err)
    for part in (found, "not the one this server was serving", ACCEPT_FLAG, "restore", RUNBOOK):
        assert part in msg, msg
    _wait(lambda: _health(srv.address) == NOT_SERVING, "health NOT_SERVING")
    lease_id = lease.lease_id if lease is not None else "0" * 32
    calls = {
        "RegisterProblems": lambda: _register(c, 2, tag="new"),
        "ReportOutcomes": lambda: c.report(lease_id, _outcome(lease) if lease is not None else []),
        "RenewLease": lambda: c.renew(lease_id),
        "PullTrajectories": lambda: c.pull(4),
        "AckTrajectories": lambda: c.ack(["1-0"]),
        "PublishPolicy": lambda: c.publish(7, "file:///w/v-7"),
        "GetStats": lambda: c.stats(),
    }
    for name, call in calls.items():
        with pytest.raises(FailedPrecondition, match="not the one this server was serving"):
            call()
            pytest.fail(f"{name} was answered on a lost namespace")
    text = srv.runtime.metrics.render().decode()
    assert "prioreplay_namespace_lost 1.0" in text, text
    assert f"prioreplay_namespace_losses_total {losses:.1f}" in text, text
    assert "prioreplay_store_healthy 0.0" in text


def _claimed(srv: BackgroundServer) -> Identity:
    identity = srv.store.identity  # type: ignore[attr-defined]  # a RedisStore
    assert identity is not None
    return identity


def test_an_empty_redis_behind_the_port_is_refused_and_the_flag_starts_anew(own_redis):
    """A promoted replica that never received the data set, simulated: the primary dies and an empty
    redis-server answers on its port. The old server refuses everything (no empty lease); a server
    started without the flag refuses to start; one started with it makes generation 2, which the
    old one follows."""
    url, port, workdir, box = own_redis
    ns = "swap"
    with _server(url, ns) as srv, _client(srv) as c:
        _register(c)
        lease = c.sample(4)
        assert len(lease.problems) == 4
        seen = _claimed(srv)
        assert seen.generation == 1
        box["proc"].kill()
        box["proc"].wait(10)
        box["proc"] = start_redis_server(port, workdir)  # empty: no persistence
        _assert_lost(srv, c, "it holds no identity", lease)
        r = redis.Redis.from_url(url)
        marker = LossMarker.parse(r.get(f"prioreplay:{{{ns}}}:lost"))
        assert marker is not None and (marker.identity, marker.how, marker.found) == (seen.encode(), "gone", "")
        assert r.dbsize() <= 3  # the marker and the health probe's key only: nothing was re-claimed
        assert r.get(f"prioreplay:{{{ns}}}:identity") is None

        with pytest.raises(FailedPrecondition, match=f"was lost while served.*{ACCEPT_FLAG}"):
            _server(url, ns).start()

        with _server(url, ns, accept_loss=True) as fresh, _client(fresh) as c2:
            new = _claimed(fresh)
            assert (new.generation, new.run_id != seen.run_id) == (2, True)
            assert r.get(f"prioreplay:{{{ns}}}:lost") is None
            _wait(lambda: _health(srv.address) == SERVING, "the old server following generation 2")
            assert _claimed(srv) == new
            assert len(c.sample(4).problems) == 0  # a new, empty generation: nothing registered yet
            _register(c2, 4, tag="q")
            assert len(c.sample(4).problems) == 4
            assert "prioreplay_namespace_lost 0.0" in srv.runtime.metrics.render().decode()
        r.close()


def test_a_flushed_database_is_found_by_the_health_refresh_and_a_restart_is_refused(own_redis):
    """FLUSHDB under a running server: its health refresh finds it before any RPC; a plain restart of
    the server refuses to start (the loss marker), so a restart never re-claims silently."""
    url, _, _, _ = own_redis
    ns = "flush"
    r = redis.Redis.from_url(url)
    with _server(url, ns) as srv, _client(srv) as c:
        _register(c)
        assert _health(srv.address) == SERVING
        r.flushdb()
        _wait(lambda: _health(srv.address) == NOT_SERVING, "health NOT_SERVING with no RPC")
        assert r.exists(f"prioreplay:{{{ns}}}:lost")
        _assert_lost(srv, c, "it holds no identity")
    with pytest.raises(FailedPrecondition, match="found it gone"):
        _server(url, ns).start()  # the same command line, restarted: refused
    with _server(url, ns, accept_loss=True) as srv, _client(srv) as c:
        assert _claimed(srv).generation == 2
        assert c.stats().problems == 0
    with _server(url, ns) as srv:  # the flag is needed once: a plain restart joins generation 2
        assert _claimed(srv).generation == 2
    r.close()


def _dump(r: redis.Redis, ns: str) -> dict[bytes, bytes]:
    """Every key of namespace ``ns`` but the health probe's and the loss marker, as ``DUMP`` answers it."""
    skip = {f"prioreplay:{{{ns}}}:{k}".encode() for k in ("health", "lost")}
    return {k: r.dump(k) for k in r.scan_iter(match=f"prioreplay:{{{ns}}}:*") if k not in skip}


def _restore(r: redis.Redis, ns: str, keys: dict[bytes, bytes], drop: bool = True) -> None:
    """Put ``keys`` back (``RESTORE ... REPLACE``); with ``drop``, delete the namespace's other keys first."""
    if drop:
        stale = [k for k in r.scan_iter(match=f"prioreplay:{{{ns}}}:*") if k not in keys]
        if stale:
            r.delete(*stale)
    for k, v in keys.items():
        r.restore(k, 0, v, replace=True)


def test_an_older_snapshot_restored_is_refused_and_restoring_the_newer_data_serves_again(redis_url, namespace):
    """Generation 1 saved, the namespace lost and started anew (generation 2), then generation 1's keys
    restored over it: both servers refuse it as older. Putting generation 2's keys back is the
    recovery: both serve again by themselves, the marker is gone, and the problems are there."""
    ns = namespace
    r = redis.Redis.from_url(redis_url)
    with _server(redis_url, ns) as a, _client(a) as ca:
        _register(ca)
        ca.sample(2)
        old_snapshot = _dump(r, ns)
        r.delete(*old_snapshot)  # the namespace vanishes (this Redis is shared: no FLUSHDB here)
        _refused(ca)
        with _server(redis_url, ns, accept_loss=True) as b, _client(b) as cb:
            _wait(lambda: _health(a.address) == SERVING, "server a following generation 2")
            _register(cb, 6, tag="g2-")
            lease = cb.sample(3)
            assert len(lease.problems) == 3
            gen2 = _dump(r, ns)
            assert Identity.parse(r.get(f"prioreplay:{{{ns}}}:identity")).generation == 2  # type: ignore[union-attr]

            _restore(r, ns, old_snapshot)  # an older snapshot restored
            _assert_lost(a, ca, "holds run", losses=2)  # its second loss: the first was the deletion
            assert "older generation" in str(_refused(cb))
            _wait(lambda: _health(b.address) == NOT_SERVING, "server b NOT_SERVING")
            marker = LossMarker.parse(r.get(f"prioreplay:{{{ns}}}:lost"))
            assert marker is not None and marker.how == "older"

            _restore(r, ns, gen2, drop=False)  # the data restored, the marker left in place
            for srv in (a, b):
                _wait(lambda srv=srv: _health(srv.address) == SERVING, "serving again once generation 2 is back")
            assert r.get(f"prioreplay:{{{ns}}}:lost") is None
            assert cb.stats().problems == 6
            assert cb.report(lease.lease_id, _outcome(lease)).accepted  # the lease of generation 2 lives on
    r.close()


def test_servers_on_one_namespace_claim_one_identity_and_a_restart_keeps_it(redis_url, namespace):
    """Several servers on one namespace (replicas, or the processes of --processes N) claim the same
    identity; a normal restart claims it again (the same run); losing it stops all of them."""
    ns = namespace
    with _server(redis_url, ns) as a, _server(redis_url, ns) as b, _client(b) as cb:
        first = _claimed(a)
        assert _claimed(b) == first
        _register(cb)
        b.stop()
        with _server(redis_url, ns) as b2, _client(b2) as cb2:
            assert _claimed(b2) == first  # restarted: the same run, nothing reset
            assert len(cb2.sample(4).problems) == 4
            redis.Redis.from_url(redis_url).delete(f"prioreplay:{{{ns}}}:identity")
            for srv in (a, b2):
                _wait(lambda srv=srv: _health(srv.address) == NOT_SERVING, "every server NOT_SERVING")
            assert "holds no identity" in str(_refused(cb2))


def _scrape(mport: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()


@pytest.mark.slow  # two spawned server processes: about 5 s
def test_every_process_of_a_multiprocess_server_finds_the_loss_and_the_restore(two_processes, redis_url, namespace):
    """``--processes 2``: both processes claimed one identity; when it vanishes both find it (the
    parent's /metrics sums prioreplay_namespace_lost to 2) and an RPC is refused; when the identity
    is put back (the data restored) both serve again without a restart."""
    address, mport, _ = two_processes
    r = redis.Redis.from_url(redis_url)
    key = f"prioreplay:{{{namespace}}}:identity"
    identity = r.get(key)
    assert Identity.parse(identity) is not None and Identity.parse(identity).generation == 1  # type: ignore[union-attr]
    r.delete(key)
    _wait(lambda: "prioreplay_namespace_lost 2.0" in _scrape(mport), "both processes finding the loss", timeout_s=20)
    with grpc.insecure_channel(address) as ch:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.PriorityServiceStub(ch).SampleProblems(pb.SampleProblemsRequest(batch_size=2), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "holds no identity" in err.value.details()
    assert "prioreplay_store_healthy 0.0" in _scrape(mport)
    r.set(key, identity)  # the data restored (here: the one key it lacked)
    _wait(lambda: "prioreplay_namespace_lost 0.0" in _scrape(mport), "both processes serving again", timeout_s=20)
    assert r.get(f"prioreplay:{{{namespace}}}:lost") is None
    r.close()
