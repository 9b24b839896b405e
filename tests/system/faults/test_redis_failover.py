"""Redis failover through Sentinel, with real processes on local ports.

A primary, two replicas (``--replicaof``) and one ``redis-server --sentinel`` (quorum 1, the
primary down after 1 s) in a temporary directory; a priority server whose store is
``redis+sentinel://.../prio``; a client thread that leases and reports in a loop. The primary is
SIGKILLed under that load. Expected: the server answers UNAVAILABLE and its health turns
NOT_SERVING while no primary is known, then follows the promoted replica and serves again
without a restart. What was lost is counted against what Redis replication promises: every
acknowledged report is sent again after the failover, and one that survived is answered
``already reported``. Replication is asynchronous, so without ``--min-replica-acks`` the reports
acknowledged in the last moment before the kill may be lost (counted, bounded by the reports of
the kill's window); with ``--min-replica-acks 1`` (Redis WAIT) none is.

Two replicas, so that after the failover the new primary still has one to acknowledge WAIT.

``master_link_status:up`` alone does not mean a replica holds the data: with diskless sync the
data set reaches it only after its REPLCONF ACK, and a primary killed within that window leaves
Sentinel to promote an empty replica. So the cluster is up only once ``WAIT`` on the primary
counts both replicas, and the kill comes only after ``WAIT`` has counted them for the registered
problems; without that the server would find no run settings on the promoted replica, claim the
namespace afresh and serve empty leases, which the test records (each lease with its time) and
names when it fails. No learner drains the trajectory queue here, so the server runs with
``max_queue_depth 0`` (no backpressure bound), or leasing would stop after 1024 groups.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.sentinel_cluster import until as _until
from prioreplay.errors import StoreUnavailable
from prioreplay.priority_server.background_server import BackgroundServer
from prioreplay.priority_server.config import ReplicationSettings, ServerConfig
from prioreplay.priority_server.open_store import create_store
from prioreplay.priority_server.store import StoreConfig
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import free_port, start_redis_server

SERVICE = "prio"
PROBLEMS = 200
BATCH = 4
#: Seconds the whole failover (kill → promoted → serving) may take: down-after 1 s, election, promotion.
FAILOVER_BOUND_S = 30.0

pytestmark = pytest.mark.slow


def _info(port: int, section: str = "replication") -> dict:
    return redis.Redis(port=port, socket_timeout=2).info(section)


def _replicas_acknowledging(port: int, replicas: int = 2, timeout_ms: int = 2000) -> int:
    """``WAIT replicas timeout_ms`` on the primary at ``port``: how many replicas have everything
    written so far (the data set and the command stream up to now), at most ``replicas``."""
    return int(redis.Redis(port=port, socket_timeout=timeout_ms / 1000 + 2).wait(replicas, timeout_ms))


class SentinelCluster:
    """A primary, two replicas and a sentinel, each a ``redis-server`` on a free port in ``workdir``."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports = {name: free_port() for name in ("primary", "replica1", "replica2", "sentinel")}

    def start(self) -> SentinelCluster:
        p = self.ports
        for name in ("primary", "replica1", "replica2"):
            d = self.workdir / name
            d.mkdir()
            # no delay before the first (diskless) full sync; 5 s by default
            extra = ("--repl-diskless-sync-delay", "0") + (
                () if name == "primary" else ("--replicaof", "127.0.0.1", str(p["primary"]))
            )
            self.procs[name] = start_redis_server(p[name], str(d), False, *extra)
        for name in ("replica1", "replica2"):
            _until(f"{name} linked to the primary", lambda name=name: _info(p[name]).get("master_link_status") == "up")
        # the link is up before a diskless sync has delivered the data set: WAIT counts a replica only
        # once it has acknowledged the primary's whole offset
        _until(
            "both replicas acknowledge the primary's offset (WAIT 2)",
            lambda: _replicas_acknowledging(p["primary"]) == 2,
            why=lambda: f"replication: {_info(p['primary'])}",
        )
        conf = self.workdir / "sentinel.conf"
        conf.write_text(
            f"port {p['sentinel']}\nbind 127.0.0.1\ndir {self.workdir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {p['primary']} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 4000\n"
            f"sentinel parallel-syncs {SERVICE} 2\n"
            f"logfile {self.workdir / 'sentinel.log'}\n"
        )
        self.procs["sentinel"] = subprocess.Popen(
            [shutil.which("redis-server"), str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _until("the sentinel knows both replicas", lambda: int(self.sentinel().sentinel_master(SERVICE)["num-slaves"]) == 2)
        return self

    def sentinel(self) -> redis.Redis:
        return redis.Redis(port=self.ports["sentinel"], socket_timeout=2, decode_responses=True)

    def master_port(self) -> int:
        return int(self.sentinel().sentinel_get_master_addr_by_name(SERVICE)[1])

    def switched_to(self) -> int | None:
        """The port of the primary once a failover has ended (``+switch-master``), else None.

        ``SENTINEL GET-MASTER-ADDR-BY-NAME`` names the promoted replica as soon as it is selected,
        while the failover is still in progress (and may yet be aborted); clients of
        ``SENTINEL MASTERS`` (redis-py's ``discover_master``) see the new primary only after the switch.
        """
        state = self.sentinel().sentinel_master(SERVICE)
        if state["is_master"] and not (state["is_sdown"] or state["is_odown"] or "failover_in_progress" in state["flags"]):
            return int(state["port"])
        return None

    def log_tail(self, lines: int = 25) -> str:
        """The sentinel's last log lines (failover events: +sdown, +selected-slave, +switch-master, -failover-abort-*)."""
        log = self.workdir / "sentinel.log"
        return "\n".join(log.read_text().splitlines()[-lines:]) if log.exists() else "(no sentinel log)"

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.ports['sentinel']}/{SERVICE}/0"

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


@pytest.fixture
def cluster(tmp_path):
    c = SentinelCluster(tmp_path)
    try:
        yield c.start()
    finally:
        c.stop()


def _server(url: str, replication: ReplicationSettings) -> BackgroundServer:
    # max_queue_depth 0: no learner drains the trajectory queue in this test, so no backpressure bound
    config = ServerConfig(
        store=url,
        namespace="failover",
        stats_interval_s=0.2,
        reaper_interval_s=0.5,
        metrics_port=0,
        max_queue_depth=0,
        **replication.model_dump(),
    )
    return BackgroundServer(
        lambda: create_store(url, config.to_store_config(), namespace="failover", replication=replication), config
    ).start()


def _report(lease: pb.SampleProblemsResponse, r: int) -> pb.ReportOutcomesRequest:
    return pb.ReportOutcomesRequest(
        lease_id=lease.lease_id,
        worker_id="w",
        outcomes=[
            pb.ProblemOutcome(
                problem_id=lp.problem.id,
                completions=[
                    pb.Completion(reward=float((j + n + r) % 2), token_ids=[1, 2], logprobs=[-0.1, -0.2]) for j in range(4)
                ],
            )
            for n, lp in enumerate(lease.problems)
        ],
    )


class Load:
    """Leases and reports in a loop on its own thread; records what was acknowledged and every error."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.PriorityServiceStub(self.channel)
        self.acked: list[tuple[float, pb.ReportOutcomesRequest]] = []  # (time acknowledged, the report)
        self.leases: list[tuple[float, int]] = []  # (time answered, problems in the lease), empty ones too
        self.errors: list[tuple[float, grpc.StatusCode]] = []
        self.messages: list[str] = []  # the server's words for each error (which address it dialled)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        r = 0
        while not self.stop.is_set():
            r += 1
            try:
                lease = self.stub.SampleProblems(pb.SampleProblemsRequest(batch_size=BATCH, worker_id="w"), timeout=10)
                self.leases.append((time.monotonic(), len(lease.problems)))
                if not lease.problems:
                    time.sleep(0.05)
                    continue
                req = _report(lease, r)
                if self.stub.ReportOutcomes(req, timeout=10).accepted:
                    self.acked.append((time.monotonic(), req))
            except grpc.RpcError as e:
                self.errors.append((time.monotonic(), e.code()))
                self.messages.append(str(e.details())[:300])
                time.sleep(0.05)

    def lost(self) -> int:
        """Acknowledged reports the store no longer has: sent again, each must be "already reported"."""
        lost = 0
        for _, req in self.acked:
            again = self._send_until_answered(req)
            lost += not (not again.accepted and again.reason == "already reported")
        return lost

    def _send_until_answered(self, req: pb.ReportOutcomesRequest, bound_s: float = FAILOVER_BOUND_S):
        """Send ``req`` again while the server answers UNAVAILABLE, as a client does (bounded).

        Right after a failover the promoted primary's other replica may still be syncing to it,
        so with ``--min-replica-acks 1`` a report is refused (UNAVAILABLE, ``read_only``) until
        the replica acknowledges writes again.
        """
        deadline = time.monotonic() + bound_s
        while True:
            try:
                return self.stub.ReportOutcomes(req, timeout=10)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def acked_since(self, t: float) -> int:
        return sum(1 for when, _ in self.acked if when > t)

    def since(self, t: float) -> str:
        """What the load met after ``t``: leases (how many empty), acknowledgements, errors and the
        last error's words, for a failure message that describes the step it failed in."""
        leases = [n for when, n in self.leases if when > t]
        errors = [m for (when, _), m in zip(self.errors, self.messages, strict=False) if when > t]
        return (
            f"since then {len(leases)} leases ({leases.count(0)} empty), {self.acked_since(t)} reports acknowledged, "
            f"{len(errors)} errors" + (f", the last: {errors[-1]!r}" if errors else "")
        )


def _health(address: str) -> int:
    with grpc.insecure_channel(address) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def _watch_health(address: str, seen: list, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            seen.append((time.monotonic(), _health(address)))
        except grpc.RpcError:
            pass
        time.sleep(0.05)


@pytest.mark.parametrize("min_replica_acks", [0, 1], ids=["async-replication", "min-replica-acks-1"])
def test_killed_primary_is_followed_to_the_promoted_replica_without_a_restart(cluster, min_replica_acks, record_property):
    t_start = time.monotonic()
    replication = ReplicationSettings(min_replica_acks=min_replica_acks, min_replica_acks_timeout_ms=1000)
    srv = _server(cluster.url, replication)
    load = Load(srv.address)
    health: list[tuple[float, int]] = []
    watching = threading.Event()
    try:
        load.stub.RegisterProblems(
            iter(
                [
                    pb.RegisterProblemsRequest(
                        problems=[pb.Problem(id=f"p{i:03d}", prompt=f"{i}+1", answer=str(i + 1)) for i in range(PROBLEMS)]
                    )
                ]
            ),
            timeout=30,
        )
        threading.Thread(target=_watch_health, args=(srv.address, health, watching), daemon=True).start()
        load.thread.start()
        _until("reports acknowledged before the kill", lambda: len(load.acked) >= 20, why=lambda: load.since(t_start))
        # the registered problems and run settings are on both replicas before the kill (else Sentinel
        # may promote a replica without them: see the module's docstring)
        old = cluster.ports["primary"]
        _until(
            "both replicas acknowledge the registered problems (WAIT 2 on the primary)",
            lambda: _replicas_acknowledging(old) == 2,
            why=lambda: f"replication: {_info(old)}",
        )

        # -- the failover ------------------------------------------------------------------
        t_kill = time.monotonic()
        cluster.procs["primary"].kill()
        switched = lambda: (port := cluster.switched_to()) != old and port  # noqa: E731
        sentinel_log = lambda: f"the sentinel's log:\n{cluster.log_tail()}"  # noqa: E731
        promoted = _until("the failover ended", switched, FAILOVER_BOUND_S, why=sentinel_log)
        t_promoted = time.monotonic()
        assert promoted in (cluster.ports["replica1"], cluster.ports["replica2"])
        _until(
            "reports acknowledged by the promoted replica",
            lambda: load.acked_since(t_promoted) >= 10,
            FAILOVER_BOUND_S,
            why=lambda: f"after the promotion: {load.since(t_promoted)}; {sentinel_log()}",
        )
        _until(
            "health SERVING again",
            lambda: health and health[-1][1] == health_pb2.HealthCheckResponse.SERVING,
            why=lambda: f"last health {health[-1:]}; after the promotion: {load.since(t_promoted)}",
        )
    finally:
        load.stop.set()
        load.thread.join(15)
        watching.set()

    try:
        # meanwhile: UNAVAILABLE and NOT_SERVING; no other status code, ever
        codes = Counter(code for _, code in load.errors)
        assert set(codes) == {grpc.StatusCode.UNAVAILABLE}, codes
        assert any(t > t_kill for t, _ in load.errors), load.errors[-5:]
        assert any(t > t_kill and s == health_pb2.HealthCheckResponse.NOT_SERVING for t, s in health), health[-20:]
        # 200 problems of mixed rewards never run out: an empty lease means the store lost them
        empty = [when - t_kill for when, n in load.leases if n == 0]
        assert not empty, (
            f"{len(empty)} empty leases, the first {empty[0]:.2f} s after the kill: the promoted replica had no problems"
        )

        lost = load.lost()
        record_property("acknowledged_reports", len(load.acked))
        record_property("acknowledged_reports_lost", lost)
        record_property("failover_s", round(t_promoted - t_kill, 2))
        print(
            f"\nmin_replica_acks={min_replica_acks}: {len(load.acked)} reports acknowledged, {lost} lost in the "
            f"failover; promoted after {t_promoted - t_kill:.1f} s; {codes[grpc.StatusCode.UNAVAILABLE]} UNAVAILABLE"
        )
        if min_replica_acks:
            assert lost == 0
        else:  # asynchronous replication: at most what was acknowledged in the kill's window
            assert lost <= load.acked_since(t_kill - 1.0) - load.acked_since(t_promoted)
        stats = load.stub.GetStats(pb.GetStatsRequest(), timeout=10)
        assert stats.problems == PROBLEMS
        assert stats.heap_size + stats.solved + stats.unsolved + stats.leased + stats.quarantined == PROBLEMS
        assert time.monotonic() - t_start < 60
    finally:
        load.channel.close()
        srv.stop()


@pytest.fixture
def lone_primary(tmp_path):
    """A Redis primary with no replica at all (every WAIT for one falls short)."""
    port = free_port()
    proc = start_redis_server(port, str(tmp_path))
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(10)


async def test_a_report_fewer_replicas_acknowledged_is_refused_as_unavailable(lone_primary):
    """``--min-replica-acks 1`` on a primary without replicas: WAIT falls short, so register and
    report answer UNAVAILABLE (kind ``read_only``, naming the setting) and health is False."""
    from prioreplay.priority_server.store.records import GroupOutcome
    from prioreplay.problems import ProblemRecord

    plain = create_store(lone_primary, StoreConfig(), namespace="acks")
    store = create_store(
        lone_primary,
        StoreConfig(),
        namespace="acks",
        replication=ReplicationSettings(min_replica_acks=1, min_replica_acks_timeout_ms=20),
    )
    try:
        problems = [ProblemRecord(id=f"p{i}", prompt="q", answer="1") for i in range(4)]
        with pytest.raises(StoreUnavailable, match="--min-replica-acks") as err:
            await store.register(problems)
        assert err.value.kind == "read_only" and "0 of the 1 replicas" in str(err.value)
        assert await plain.healthy() and not await store.healthy()
        lease = await plain.sample(2, 60.0)
        with pytest.raises(StoreUnavailable, match="--min-replica-acks"):
            await store.report(
                lease.lease_id, [GroupOutcome(problem_id=sp.problem.id, rewards=(1.0, 0.0), payload=b"") for sp in lease.problems]
            )
    finally:
        await store.close()
        await plain.close()
