"""Part 1d: what ``--min-replica-acks`` (Redis WAIT after each report) costs on the report path.

A Redis primary and one replica (``--replicaof``), both ``redis-server`` on free local ports in a
temporary directory; the Redis store leases B problems and reports them (G rewards each, with a
trajectory payload) ``rounds`` times, once with ``min_replica_acks`` 0 and once with 1, the two
runs interleaved in blocks so that the machine's load hits both alike. The figure is the store's
``report`` call time (p50, p90, ms): the script, plus WAIT's round trip to the replica.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from typing import Any

import redis


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(port: int, workdir: str, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
            "--repl-diskless-sync-delay",
            "0",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            if redis.Redis(port=port).ping():
                return proc
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"redis-server on port {port} did not start")


async def _report_times(url: str, acks: int, batch: int, group: int, rounds: int, namespace: str) -> list[float]:
    from prioreplay.priority_server.config import ReplicationSettings
    from prioreplay.priority_server.open_store import create_store
    from prioreplay.priority_server.store import StoreConfig
    from prioreplay.priority_server.store.records import GroupOutcome
    from prioreplay.problems import ProblemRecord

    store = create_store(url, StoreConfig(), namespace=namespace, replication=ReplicationSettings(min_replica_acks=acks))
    times = []
    try:
        await store.register([ProblemRecord(id=f"p{i}", prompt="q", answer="1") for i in range(4 * batch)])
        payload = bytes(16 * group)
        for r in range(rounds):
            lease = await store.sample(batch, 600.0)
            outs = [
                GroupOutcome(problem_id=sp.problem.id, rewards=tuple(float((j + r) % 2) for j in range(group)), payload=payload)
                for sp in lease.problems
            ]
            t0 = time.perf_counter()
            await store.report(lease.lease_id, outs)
            times.append((time.perf_counter() - t0) * 1000.0)
    finally:
        await store.close()
    return times


def _pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1]


def run(batch: int = 64, group: int = 8, rounds: int = 200, blocks: int = 4) -> dict[str, Any]:
    """Report-call times without and with ``min_replica_acks`` 1 (see the module docstring)."""
    workdir = tempfile.mkdtemp(prefix="prioreplay-bench-acks-")
    p, r = _free_port(), _free_port()
    procs = [_start(p, workdir)]
    try:
        rdir = tempfile.mkdtemp(dir=workdir)
        procs.append(_start(r, rdir, "--replicaof", "127.0.0.1", str(p)))
        while redis.Redis(port=r).info("replication").get("master_link_status") != "up":
            time.sleep(0.05)
        url = f"redis://127.0.0.1:{p}/0"
        times: dict[int, list[float]] = {0: [], 1: []}
        for b in range(blocks):
            for acks in (0, 1):
                times[acks] += asyncio.run(_report_times(url, acks, batch, group, rounds // blocks, f"acks{acks}-{b}"))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
    out = {f"acks{a}_{q}_ms": _pct(t, q) for a, t in times.items() for q in (50, 90)}
    out.update(batch_size=batch, group_size=group, reports=len(times[0]))
    out["added_p50_ms"] = out["acks1_50_ms"] - out["acks0_50_ms"]
    return out
