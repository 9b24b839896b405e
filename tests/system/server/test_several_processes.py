"""``prioreplay server --processes 2`` on one Redis: exactly-once leases, reports, pulls, acks, publishing.

Two server processes share one port (SO_REUSEPORT); 16 client connections (each its own TCP
connection, so the kernel spreads them over both processes) sample and report concurrently, every
lease is reported twice at once over two connections, two learners pull and acknowledge, and
policy versions are published from several connections. The conservation invariants must hold as
with one process, and the parent's /metrics must count the RPCs of both processes.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc

from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import REPO, cli

PROBLEMS = 600
CLIENTS = 16
ROUNDS = 12
BATCH = 16


def _stub(address: str) -> tuple[grpc.Channel, pb_grpc.PriorityServiceStub]:
    # a local subchannel pool: each channel opens its own connection (the unit SO_REUSEPORT balances)
    ch = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
    return ch, pb_grpc.PriorityServiceStub(ch)


def _metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    assert m, f"{name}{labels} not in /metrics"
    return float(m.group(1))


def test_two_processes_keep_every_exactly_once_guarantee(two_processes):
    address, mport, _ = two_processes
    ch, stub = _stub(address)
    stub.RegisterProblems(
        iter(
            [
                pb.RegisterProblemsRequest(
                    problems=[pb.Problem(id=f"p{i:04d}", prompt=f"{i}+1", answer=str(i + 1)) for i in range(PROBLEMS)]
                )
            ]
        ),
        timeout=30,
    )
    lock = threading.Lock()
    leased: list[list[str]] = []
    accepted: list[tuple[int, int]] = []  # (groups queued, completions) of accepted reports
    samples = 0

    def client(k: int) -> None:
        nonlocal samples
        ch1, s1 = _stub(address)
        ch2, s2 = _stub(address)
        try:
            for r in range(ROUNDS):
                lease = s1.SampleProblems(pb.SampleProblemsRequest(batch_size=BATCH, worker_id=f"w{k}"), timeout=30)
                ids = [lp.problem.id for lp in lease.problems]
                outs = [
                    pb.ProblemOutcome(
                        problem_id=pid,
                        completions=[
                            pb.Completion(
                                reward=float((j + n + r) % 2 if n % 3 else 1.0), token_ids=[1, 2], logprobs=[-0.1, -0.2]
                            )
                            for j in range(4)
                        ],
                    )
                    for n, pid in enumerate(ids)
                ]
                req = pb.ReportOutcomesRequest(lease_id=lease.lease_id, outcomes=outs, worker_id=f"w{k}")
                # the same report twice at once, over two connections: exactly one is accepted
                f1, f2 = s1.ReportOutcomes.future(req, timeout=30), s2.ReportOutcomes.future(req, timeout=30)
                r1, r2 = f1.result(), f2.result()
                assert sorted([r1.accepted, r2.accepted]) == [False, True], (r1, r2)
                ok = r1 if r1.accepted else r2
                with lock:
                    samples += 1
                    leased.append(ids)
                    accepted.append((ok.groups_queued, 4 * len(ids)))
        finally:
            ch1.close()
            ch2.close()

    pulled: list[str] = []
    stop = threading.Event()

    def learner(name: str) -> None:
        c, s = _stub(address)
        try:
            while True:
                r = s.PullTrajectories(pb.PullTrajectoriesRequest(max_groups=64, wait_s=0.2, consumer=name), timeout=30)
                ids = [g.group_id for g in r.groups]
                if ids:
                    assert s.AckTrajectories(pb.AckTrajectoriesRequest(group_ids=ids), timeout=30).acked == len(ids)
                    with lock:
                        pulled.extend(ids)
                elif stop.is_set():
                    return
        finally:
            c.close()

    def publisher(v: int) -> int:
        c, s = _stub(address)
        try:
            return s.PublishPolicy(pb.PublishPolicyRequest(version=v, weights_uri=f"ckpt/{v}"), timeout=30).version
        except grpc.RpcError as e:  # a newer version was published first: refused, never applied
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
            return -1
        finally:
            c.close()

    with ThreadPoolExecutor(CLIENTS + 2 + 4) as pool:
        learners = [pool.submit(learner, f"learner-{i}") for i in range(2)]
        try:
            published = list(pool.map(publisher, range(1, 41)))
            for f in [pool.submit(client, k) for k in range(CLIENTS)]:
                f.result()
        finally:
            stop.set()
        for f in learners:
            f.result()

    # leases: no problem twice in a lease, every lease reported once, nothing left leased
    assert all(len(ids) == len(set(ids)) for ids in leased)
    stats = stub.GetStats(pb.GetStatsRequest(), timeout=30)
    assert stats.leased == 0 and stats.active_leases == 0
    assert stats.heap_size + stats.solved + stats.unsolved == stats.problems == PROBLEMS
    assert stats.late_reports == len(leased)  # the losing copy of each report
    assert stats.completions_reported == sum(c for _, c in accepted)
    # pulls and acks: every queued group delivered once and acknowledged once
    queued = sum(q for q, _ in accepted)
    assert queued > 0 and len(pulled) == len(set(pulled)) == queued == stats.groups_mixed
    assert stats.groups_acked == queued and stats.queue_depth == 0 and stats.pending_groups == 0
    again = stub.AckTrajectories(pb.AckTrajectoriesRequest(group_ids=pulled[:10]), timeout=30)
    assert again.acked == 0 and again.unknown == 10
    # publishing: versions never go backwards, the newest wins
    assert (
        all(v == -1 or v >= req for v, req in zip(published, range(1, 41), strict=False)) and stats.policy_version == 40
    )  # strict=False: published may hold fewer versions than the 40 requests
    assert stats.weights_uri == "ckpt/40"
    # one /metrics for both: the RPC counts of both processes add up
    text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
    assert _metric(text, "prioreplay_server_processes") == 2
    assert _metric(text, "prioreplay_rpc_latency_seconds_count", '{method="SampleProblems"}') == samples
    assert _metric(text, "prioreplay_rpc_latency_seconds_count", '{method="ReportOutcomes"}') == 2 * samples
    # both processes served: 2 x 16 client connections were spread over them by the kernel
    per_process = [_metric(text, "prioreplay_server_process_rpcs_total", f'{{process="{i}"}}') for i in (1, 2)]
    assert min(per_process) > 0, per_process
    ch.close()


def test_memory_store_refuses_several_processes():
    r = subprocess.run(
        [sys.executable, "-m", "prioreplay.apps.cli", "server", "--processes", "2", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert r.returncode == 2 and "needs a Redis store" in r.stderr and "--processes 1" in r.stderr, r.stderr


def test_a_port_in_use_is_refused(redis_url, namespace):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run(
            cli("server", store=redis_url, namespace=namespace, processes=2, port=port, metrics_port=0),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
    assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr


def test_a_dns_or_address_list_target_spreads_rpcs_round_robin():
    """A client of ``ipv4:A,B`` (as of ``dns:///name:port`` resolving to several replicas) calls
    both servers; a plain HOST:PORT client stays on one."""
    from prioreplay.client import PriorityClient
    from prioreplay.config import ClientSettings
    from prioreplay.priority_server.background_server import BackgroundServer
    from prioreplay.priority_server.config import ServerConfig
    from prioreplay.priority_server.open_store import create_store
    from prioreplay.priority_server.store import StoreConfig

    cfg = ServerConfig(metrics_port=0, snapshot_interval_s=0)
    with (
        BackgroundServer(lambda: create_store("memory", StoreConfig()), cfg) as a,
        BackgroundServer(lambda: create_store("memory", StoreConfig()), cfg) as b,
    ):
        for srv, n in ((a, 1), (b, 2)):  # tell the replicas apart by their problem counts
            c = PriorityClient(ClientSettings(server=srv.address))
            c.register([pb.Problem(id=f"p{i}", prompt="q", answer="1") for i in range(n)])
            c.close()
        both = PriorityClient(ClientSettings(server=f"ipv4:127.0.0.1:{a.port},127.0.0.1:{b.port}"))
        both.wait_ready()
        time.sleep(0.5)  # round_robin connects to every address; let both subchannels become ready
        assert {both.stats().problems for _ in range(20)} == {1, 2}
        both.close()
        one = PriorityClient(ClientSettings(server=a.address))
        assert {one.stats().problems for _ in range(20)} == {1}
        one.close()
        dns = PriorityClient(ClientSettings(server=f"dns:///localhost:{a.port}"))
        assert dns.stats().problems == 1  # the dns resolver with the round_robin policy
        dns.close()
