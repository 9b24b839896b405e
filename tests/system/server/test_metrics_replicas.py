"""Every server process and every replica observed: summed counters never decrease, new replicas get traffic.

1. ``prioreplay server --processes 2``: one child is stopped (SIGSTOP) so its ``/metrics`` does not
   answer; the parent's sums must not fall (the child's last known values stay in them), then
   grow again once it answers. Without the last-known-value cache the stopped child's RPCs drop
   out of the sum and ``rate()`` reads a reset.
2. A replica added behind a DNS name while a client is connected and busy: with
   ``--max-connection-age-s`` the server closes each connection after that age (GOAWAY), the
   client resolves the name again and spreads its RPCs over the new address list too, so the new
   replica gets RPCs within the connection age. Without it (``0``) the client never asks DNS
   again. The name is served by a small DNS responder of the test on a local UDP port (gRPC's
   c-ares resolver takes the DNS server as the target's authority: ``dns://127.0.0.1:P/name:port``),
   so the test controls what the name resolves to: first ``127.0.0.1``, then also ``127.0.0.2``
   (both loopback addresses, the same port).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import threading
import time
import urllib.request

import grpc
import pytest

from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import free_port, server_children


def _scrape(mport: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=20).read().decode()


def _sum(text: str, name: str) -> float:
    """The sum of every sample of ``name`` (any labels)."""
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def _busy(address: str, calls: int, connections: int = 8) -> None:
    """``calls`` GetStats RPCs over each of ``connections`` connections (spread over the processes)."""
    for _ in range(connections):
        with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            stub = pb_grpc.PriorityServiceStub(ch)
            for _ in range(calls):
                stub.GetStats(pb.GetStatsRequest(), timeout=10)


@pytest.mark.slow
def test_summed_counters_never_decrease_while_a_child_stalls_its_metrics(two_processes):
    address, mport, parent = two_processes
    counters = ("prioreplay_rpc_latency_seconds_count", "prioreplay_server_process_rpcs_total")
    # the kernel spreads connections over the processes by a hash (SO_REUSEPORT): 8 connections all
    # land on one process about 1 time in 128, so connect again (at most 8 rounds, 64 connections)
    # until both have served
    for _ in range(8):
        _busy(address, 5)
        before = _scrape(mport)
        per_process = re.findall(r'^prioreplay_server_process_rpcs_total{process="(\d)"} (\S+)$', before, re.M)
        if len(per_process) == 2 and all(float(v) > 0 for _, v in per_process):
            break
    assert len(per_process) == 2 and all(float(v) > 0 for _, v in per_process), per_process  # both served
    stalled = server_children(parent.pid)[0]
    os.kill(stalled, signal.SIGSTOP)  # its /metrics accepts the connection and never answers
    try:
        during = _scrape(mport)
        for name in counters:
            assert _sum(during, name) >= _sum(before, name) > 0, name
        assert _sum(during, "prioreplay_server_processes") == 1
        assert sorted(re.findall(r'^prioreplay_server_process_up{process="\d"} (\S+)$', during, re.M)) == ["0.0", "1.0"]
    finally:
        os.kill(stalled, signal.SIGCONT)
    _busy(address, 5)
    after = _scrape(mport)
    assert _sum(after, "prioreplay_server_processes") == 2
    for name in counters:
        assert _sum(after, name) > _sum(during, name), name


class TinyDNS:
    """A DNS responder on a local UDP port: every A query is answered with :attr:`addresses`
    (TTL 0); any other query type gets no records. Enough for gRPC's c-ares resolver."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.addresses: list[str] = []
        self.queries = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                data, peer = self.sock.recvfrom(512)
            except OSError:  # closed
                return
            qid = struct.unpack(">H", data[:2])[0]
            end = 12
            while data[end]:  # the question's name: length-prefixed labels up to a zero byte
                end += data[end] + 1
            question, qtype = data[12 : end + 5], struct.unpack(">H", data[end + 1 : end + 3])[0]
            answers = list(self.addresses) if qtype == 1 else []
            self.queries += qtype == 1
            head = struct.pack(">HHHHHH", qid, 0x8180, 1, len(answers), 0, 0)  # a response, no error
            body = b"".join(b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 0, 4) + socket.inet_aton(a) for a in answers)
            self.sock.sendto(head + question + body, peer)

    def close(self) -> None:
        self.sock.close()


def _replica(host: str, port: int, problems: int, max_connection_age_s: float):
    """An in-process server on ``host:port`` holding ``problems`` problems (to tell replicas apart)."""
    from prioreplay.priority_server.background_server import BackgroundServer
    from prioreplay.priority_server.config import ServerConfig
    from prioreplay.priority_server.open_store import create_store
    from prioreplay.priority_server.store import StoreConfig
    from prioreplay.problems import ProblemRecord

    cfg = ServerConfig(
        metrics_port=0, snapshot_interval_s=0, max_connection_age_s=max_connection_age_s, max_connection_age_grace_s=1
    )
    srv = BackgroundServer(lambda: create_store("memory", StoreConfig()), cfg, address=f"{host}:{port}").start()
    srv.call(srv.store.register([ProblemRecord(id=f"p{i}", prompt="q", answer="1") for i in range(problems)]))
    return srv


#: The connection age of the test, seconds; a new replica must get RPCs within STATED_S.
AGE_S = 1.0
STATED_S = 3 * AGE_S


@pytest.mark.slow
@pytest.mark.parametrize("max_connection_age_s", [AGE_S, 0.0], ids=["connection-age", "connections-live-forever"])
def test_a_replica_added_under_load_receives_rpcs_within_the_connection_age(max_connection_age_s):
    dns = TinyDNS()
    dns.addresses = ["127.0.0.1"]
    port = free_port()
    first = _replica("127.0.0.1", port, 1, max_connection_age_s)
    added = None
    # what PriorityClient sets for a dns:/// target (round_robin), and re-resolution allowed at the
    # test's pace (gRPC's default minimum between two resolutions is 30 s)
    ch = grpc.insecure_channel(
        f"dns://127.0.0.1:{dns.port}/replicas.test:{port}",
        options=[
            ("grpc.service_config", json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})),
            ("grpc.dns_min_time_between_resolutions_ms", 100),
        ],
    )
    try:
        stub = pb_grpc.PriorityServiceStub(ch)
        assert stub.GetStats(pb.GetStatsRequest(), timeout=10).problems == 1
        added = _replica("127.0.0.2", port, 2, max_connection_age_s)  # the replica added under load
        dns.addresses = ["127.0.0.1", "127.0.0.2"]
        t_added = time.monotonic()
        reached = None
        while time.monotonic() - t_added < STATED_S + 1.0:
            if stub.GetStats(pb.GetStatsRequest(), timeout=10).problems == 2:
                reached = time.monotonic() - t_added
                break
            time.sleep(0.02)
        if max_connection_age_s:
            assert reached is not None and reached < STATED_S, reached
            print(f"\nnew replica reached {reached:.2f} s after it was added (connection age {AGE_S} s)")
        else:  # the client never resolves the name again: the new replica gets nothing
            assert reached is None
    finally:
        ch.close()
        for srv in (first, added):
            if srv is not None:
                srv.stop()
        dns.close()
