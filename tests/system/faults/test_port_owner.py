"""Exactly one group of server processes owns a port (docs/GUARANTEES.md, "One group of processes per
port"; issue 43, item 3), with real processes.

``prioreplay server --processes 2 --port P`` twice at the same moment, on two namespaces: before,
both passed the "port is free" check and their children joined P with SO_REUSEPORT, so fresh
connections split between two runs. Now one group holds P's sentinel and the other exits 2 naming
the port; every fresh connection reaches the one that runs.
"""

from __future__ import annotations

import subprocess
import time
import uuid

import grpc
import pytest

from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import REPO, cli, drop_namespace, free_port

CONNECTIONS = 20


def _stats(address: str) -> pb.GetStatsResponse:
    # a local subchannel pool: a connection of its own (the unit SO_REUSEPORT spreads)
    with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        return pb_grpc.PriorityServiceStub(ch).GetStats(pb.GetStatsRequest(), timeout=10)


def _wait_serving(address: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, "the group that owns the port exited"
        try:
            _stats(address)
            return
        except grpc.RpcError:
            assert time.monotonic() < deadline, "the server did not answer"
            time.sleep(0.2)


@pytest.mark.slow
def test_two_groups_started_at_once_never_share_a_port(redis_url):
    port = free_port()
    namespaces = [f"port-{uuid.uuid4().hex[:10]}" for _ in range(2)]
    procs = [
        subprocess.Popen(
            cli("server", store=redis_url, namespace=ns, processes=2, port=port, metrics_port=0),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for ns in namespaces
    ]
    try:
        # the loser refuses at once, before it starts a child
        deadline = time.monotonic() + 60
        while all(p.poll() is None for p in procs):
            assert time.monotonic() < deadline, "both groups are running on one port"
            time.sleep(0.1)
        loser = next(i for i, p in enumerate(procs) if p.poll() is not None)
        winner = 1 - loser
        err = procs[loser].stderr.read()
        assert procs[loser].returncode == 2 and f"cannot own 127.0.0.1:{port}" in err, err

        address = f"127.0.0.1:{port}"
        _wait_serving(address, procs[winner])
        with grpc.insecure_channel(address) as ch:
            problems = [pb.Problem(id=f"p{i}", prompt=f"{i}+1", answer=str(i + 1)) for i in range(7)]
            pb_grpc.PriorityServiceStub(ch).RegisterProblems(iter([pb.RegisterProblemsRequest(problems=problems)]), timeout=30)
        seen = [_stats(address).problems for _ in range(CONNECTIONS)]
        assert seen == [7] * CONNECTIONS, seen  # every connection reaches the one run
        assert procs[winner].poll() is None
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait(60)
        for ns in namespaces:
            drop_namespace(redis_url, ns)
