"""Servers and stores for the service benchmarks: start a priority server (in-process or as
subprocesses) over a fresh namespace, open channels to it, meter its CPU, register problems,
and delete the namespace afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from benchmarks.service_load import MAX_MESSAGE_BYTES, ServiceParams, make_problem
from prioreplay.channel import free_port
from prioreplay.convert import problem_to_proto
from prioreplay.priority_server.store import Store, StoreConfig
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc


# -- servers, stores, cleanup -----------------------------------------------------------------
def store_spec(kind: str, redis_url: str) -> str:
    return "memory" if kind == "memory" else redis_url


def make_store(kind: str, redis_url: str, namespace: str, seed: int = 0) -> Store:
    from prioreplay.priority_server.open_store import create_store

    return create_store(store_spec(kind, redis_url), StoreConfig(seed=seed), namespace=namespace)


async def delete_namespace(redis_url: str, namespace: str) -> int:
    """Delete every key of ``namespace`` (keys carry the hash tag ``{namespace}``). Returns the count."""
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(redis_url)
    n = 0
    try:
        batch = [k async for k in r.scan_iter(match=f"*{{{namespace}}}*", count=1000)]
        for i in range(0, len(batch), 1000):
            n += await r.delete(*batch[i : i + 1000])
    finally:
        await r.aclose()
    return n


@contextlib.asynccontextmanager
async def serve(
    kind: str, params: ServiceParams, redis_url: str, namespace: str, processes: int = 1, pids: list[int] | None = None
) -> AsyncIterator[str]:
    """A priority server on a free port for the duration of the block; yields its address.

    ``processes`` > 1: ``prioreplay server --processes N`` (a subprocess, Redis only). ``pids``
    receives the server's process id (subprocess servers), for CPU accounting.
    """
    if params.server == "inprocess" and processes == 1:
        from prioreplay.priority_server.config import ServerConfig
        from prioreplay.priority_server.server import create_server, stop_server

        store = make_store(kind, redis_url, namespace)
        # no learner drains the queue here: backpressure off, so throughput is measured, not refusals
        server, port = await create_server("127.0.0.1:0", store, ServerConfig(max_queue_depth=0))  # started
        try:
            yield f"127.0.0.1:{port}"
        finally:
            await stop_server(server, grace_s=1.0)
            await store.close()
        return
    import tempfile

    port = free_port()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(server_args(kind, redis_url, namespace, port, processes), stdout=subprocess.DEVNULL, stderr=err)
        if pids is not None:
            pids.append(proc.pid)
        try:
            address = f"127.0.0.1:{port}"
            await wait_answering(proc, err, address, processes)
            yield address
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def server_args(kind: str, redis_url: str, namespace: str, port: int, processes: int) -> list[str]:
    """The ``prioreplay server`` command line of :func:`serve` (backpressure off, quiet logs)."""
    store = store_spec(kind, redis_url)
    return [
        *(sys.executable, "-m", "prioreplay.apps.cli", "server", "--store", store, "--namespace", namespace),
        *("--port", str(port), "--metrics-port", "0", "--log-level", "WARNING"),
        *("--max-message-mb", str(MAX_MESSAGE_BYTES // (1024 * 1024)), "--processes", str(processes), "--max-queue-depth", "0"),
    ]


async def wait_answering(proc: subprocess.Popen, err: Any, address: str, processes: int, timeout_s: float = 60.0) -> None:
    """Return when every process of the server at ``address`` answers GetStats.

    Raises:
        RuntimeError: the server exited (with its stderr's tail) or did not answer within ``timeout_s``.
    """
    import grpc

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            err.seek(0)
            raise RuntimeError(f"prioreplay server exited with {proc.returncode}: {err.read().decode()[-2000:]}")
        try:
            for _ in range(processes * 4):  # each connection may land on another process
                ch = await channel(address, timeout_s=1.0)
                await pb_grpc.PriorityServiceStub(ch).GetStats(pb.GetStatsRequest(), timeout=1.0)
                await ch.close()
            return
        except (TimeoutError, grpc.aio.AioRpcError):
            if time.monotonic() > deadline:
                raise RuntimeError(f"prioreplay server on {address} did not answer within {timeout_s:g} s") from None


async def channel(address: str, timeout_s: float = 60.0):
    """A ready grpc.aio channel with its own connection (a local subchannel pool: with
    ``--processes N`` each connection may be served by another process)."""
    import grpc

    opts = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.use_local_subchannel_pool", 1),
    ]
    ch = grpc.aio.insecure_channel(address, options=opts)
    try:
        await asyncio.wait_for(ch.channel_ready(), timeout_s)
    except BaseException:
        await ch.close()
        raise
    return ch


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its live descendants (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return total


class CpuMeter:
    """CPU use over a window, in cores: this (benchmark client) process and the server processes."""

    def __init__(self, server_pids: list[int]):
        self.server_pids = server_pids

    def __enter__(self) -> CpuMeter:
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()
        self.s0 = sum(tree_cpu_s(p) for p in self.server_pids)
        return self

    def __exit__(self, *exc) -> None:
        wall = max(1e-9, time.perf_counter() - self.t0)
        self.client_cores = (time.process_time() - self.c0) / wall
        self.server_cores = (sum(tree_cpu_s(p) for p in self.server_pids) - self.s0) / wall if self.server_pids else None


async def connections(address: str, n: int) -> list[Any]:
    return [await channel(address) for _ in range(n)]


async def register_grpc(stub: Any, n: int, chunk: int = 512) -> tuple[pb.RegisterProblemsResponse, float]:
    """Stream ``n`` synthetic problems in chunks. Returns (response, seconds)."""

    async def chunks():
        for start in range(0, n, chunk):
            yield pb.RegisterProblemsRequest(
                problems=[problem_to_proto(make_problem(i)) for i in range(start, min(n, start + chunk))]
            )

    t = time.perf_counter()
    resp = await stub.RegisterProblems(chunks())
    return resp, time.perf_counter() - t
