"""A server process that stops answering is killed and started again by its parent
(docs/GUARANTEES.md, "A server process that stops answering"; issue 43, item 4), with real processes.

``prioreplay server --processes 2``: one child is stopped with SIGSTOP. It keeps its listener, so
before, 9-14 of 20 fresh connections met DEADLINE_EXCEEDED for as long as it stayed stopped. Now the
parent misses its heartbeats, kills it and starts it again within ``--heartbeat-timeout-s``; every
fresh connection is answered, the restart is counted, summed counters never decrease. And when the
parent itself is killed, its children notice (the heartbeat pipe breaks) and stop, so no orphan
keeps the port.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import REPO, cli, free_port, server_children

#: The test's --heartbeat-timeout-s, seconds (the default is 10).
TIMEOUT_S = 3.0
CONNECTIONS = 20


def _scrape(mport: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=20).read().decode()


def _sum(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def _stats(address: str, timeout_s: float = 5.0) -> pb.GetStatsResponse:
    # a local subchannel pool: a connection of its own, which the kernel gives to either process
    with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        return pb_grpc.PriorityServiceStub(ch).GetStats(pb.GetStatsRequest(), timeout=timeout_s)


def _wait(check, what: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s"
        time.sleep(0.1)


def _both_up(mport: int) -> bool:
    try:
        text = _scrape(mport)
    except OSError:
        return False
    return "prioreplay_server_processes 2.0" in text and "prioreplay_store_healthy 1.0" in text


@pytest.fixture
def group(redis_url, namespace) -> Iterator[tuple[str, int, subprocess.Popen, list[str]]]:
    """``prioreplay server --processes 2 --heartbeat-timeout-s 3`` once both processes serve:
    (address, metrics port, parent, its log lines)."""
    port, mport = free_port(), free_port()
    args = cli(
        "server",
        store=redis_url,
        namespace=namespace,
        processes=2,
        port=port,
        metrics_port=mport,
        stats_interval_s=0.2,
        heartbeat_timeout_s=TIMEOUT_S,
    )
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    try:
        _wait(lambda: proc.poll() is None and _both_up(mport) or proc.poll() is not None, "both processes up")
        assert proc.poll() is None, "".join(lines)
        yield f"127.0.0.1:{port}", mport, proc, lines
    finally:
        for child in server_children(proc.pid) if proc.poll() is None else []:
            os.kill(child, signal.SIGCONT)
        if proc.poll() is None:
            proc.terminate()
        proc.wait(60)


@pytest.mark.slow
def test_a_stopped_process_is_killed_and_started_again_and_every_connection_is_answered(group):
    address, mport, parent, lines = group
    with grpc.insecure_channel(address) as ch:
        problems = [pb.Problem(id=f"p{i}", prompt=f"{i}+1", answer=str(i + 1)) for i in range(7)]
        pb_grpc.PriorityServiceStub(ch).RegisterProblems(iter([pb.RegisterProblemsRequest(problems=problems)]), timeout=30)
    for _ in range(CONNECTIONS):
        _stats(address)
    before = _scrape(mport)
    stopped, other = server_children(parent.pid)
    os.kill(stopped, signal.SIGSTOP)  # it keeps its listener and answers nothing
    t0 = time.monotonic()
    _wait(lambda: stopped not in server_children(parent.pid) and len(server_children(parent.pid)) == 2, "a restart")
    assert time.monotonic() - t0 < TIMEOUT_S + 5, "the stopped process was not killed within the heartbeat timeout"
    assert other in server_children(parent.pid)  # the one that answered was left alone
    _wait(lambda: _both_up(mport), "the restarted process serving")

    answers = [_stats(address).problems for _ in range(CONNECTIONS)]  # DEADLINE_EXCEEDED would raise
    assert answers == [7] * CONNECTIONS
    after = _scrape(mport)
    assert _sum(after, "prioreplay_server_process_restarts_total") == 1
    for name in ("prioreplay_rpc_latency_seconds_count", "prioreplay_server_process_rpcs_total"):
        assert _sum(after, name) >= _sum(before, name) > 0, name  # the killed life's counts stay in the sums
    assert "sent no heartbeat" in "".join(lines)
    assert parent.poll() is None


@pytest.mark.slow
def test_children_stop_when_their_parent_is_killed(group):
    address, _, parent, _ = group
    children = server_children(parent.pid)
    parent.kill()  # SIGKILL: no SIGTERM reaches the children
    parent.wait(10)

    def alive(pid: int) -> bool:
        try:
            return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()  # a zombie's is empty
        except OSError:
            return False

    def gone() -> bool:
        return not any(alive(pid) for pid in children)

    _wait(gone, "the orphaned children stopping", timeout_s=30)
    with pytest.raises(grpc.RpcError):
        _stats(address, timeout_s=2)
