"""Part 1: throughput and latency of the priority service, and its ceiling.

Workload (the issue's): register P problems; C concurrent asyncio clients each loop
SampleProblems(B) → ReportOutcomes with synthetic outcomes of G completions each (random binary
rewards, ``tokens`` token ids and log-probabilities per completion). Measured per (store, C):
problems sampled per second, outcomes reported per second, p50/p99 latency of each RPC.

The ceiling is the same loop issued to the store in-process (no gRPC, no servicer): the
``MemoryStore`` called directly, and the ``RedisStore`` called directly (its Lua scripts over
redis-py's asyncio connection pool). ``our / ceiling`` is the end-to-end rate divided by the
ceiling rate, both measured in the same run, side by side.

Also measured on Redis: memory per problem (``INFO memory`` before/after registering 10^6
problems, and the exact ``MEMORY USAGE`` of this run's keys, prompts separated) and the time to
register 10^6 problems through ``RegisterProblems``.

The workload and load loop are :mod:`benchmarks.service_load`, the servers and stores
:mod:`benchmarks.service_servers`, the open-loop part 1b :mod:`benchmarks.service_openloop`.

Every Redis key this module creates carries a fresh ``bench-<hex>`` namespace and is deleted at
the end (also on errors).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.service_load import (
    DEFAULT_REDIS_URL,
    QUICK,
    Outcomes,
    ServiceParams,
    grpc_fns,
    load,
    make_problem,
    store_fns,
)
from benchmarks.service_servers import (
    CpuMeter,
    channel,
    connections,
    delete_namespace,
    make_store,
    register_grpc,
    serve,
)
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc


# -- the report path, before/after ------------------------------------------------------------
def run_report_path(params: ServiceParams, reports: int = 20, rounds: int = 7, seed: int = 0) -> dict[str, Any]:
    """Server-side handling of ReportOutcomes(B) without the store: the per-field path (the
    server before the lean path; still the fallback) against the lean path, on the same request
    bytes, interleaved round by round in one process (so machine load hits both alike).

    Each path decodes the received bytes and turns them into the store's groups (validation and
    mixed-group payloads included). Returns medians over rounds of ms per report and the ratio.
    """
    from prioreplay.priority_server.wire import canonical_groups, report_groups

    gen = Outcomes(params, seed)
    ids = [make_problem(i).id for i in range(params.batch_size)]
    raws = [
        pb.ReportOutcomesRequest(lease_id="L" * 32, outcomes=gen.proto(ids), worker_id="bench").SerializeToString()
        for _ in range(reports)
    ]

    def per_field(raw: bytes) -> Any:
        return report_groups(raw, pb.ReportOutcomesRequest.FromString(raw), 1.0, True, fast=False)

    def lean(raw: bytes) -> Any:
        out = canonical_groups(raw, pb.ReportOutcomesRequest.FromString(raw), 1.0, True)
        assert out is not None
        return out

    assert [(g.problem_id, g.rewards, g.payload) for g in per_field(raws[0])] == lean(raws[0])
    times: dict[str, list[float]] = {"per_field": [], "lean": []}
    for _ in range(rounds):
        for name, fn in (("per_field", per_field), ("lean", lean)):
            t = time.perf_counter()
            for raw in raws:
                fn(raw)
            times[name].append((time.perf_counter() - t) / reports * 1e3)
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {
        "per_field_ms": med["per_field"],
        "lean_ms": med["lean"],
        "speedup": med["per_field"] / med["lean"],
        "request_bytes": len(raws[0]),
        "rounds": rounds,
        "reports_per_round": reports,
    }


async def _throughput_grpc(
    kind: str, n_proc: int, params: ServiceParams, redis_url: str, out: dict[str, Any], say: Callable[[str], None]
) -> None:
    """End to end: register over gRPC, then one row per C of gRPC clients against ``n_proc`` servers."""
    ns = f"bench-{uuid.uuid4().hex[:12]}"
    pids: list[int] = []
    try:
        async with serve(kind, params, redis_url, ns, processes=n_proc, pids=pids) as address:
            chans = await connections(address, min(max(params.concurrency), 16))
            try:
                resp, secs = await register_grpc(pb_grpc.PriorityServiceStub(chans[0]), params.problems)
                assert resp.total == params.problems, resp
                out["register_s"].setdefault(kind, secs)
                say(f"service: {kind} x{n_proc}: registered {params.problems} problems over gRPC in {secs:.1f}s")
                for c in params.concurrency:
                    fns = [grpc_fns(ch, params, seed=c * 100 + i) for i, ch in enumerate(chans[: min(c, 16)])]
                    with CpuMeter(pids) as cpu:
                        res = await load(c, fns, params.duration_s, params.warmup_s)
                    out["rows"].append(
                        {
                            "store": kind,
                            "path": "grpc",
                            "processes": n_proc,
                            "clients": c,
                            **res.summary(),
                            "client_cores": cpu.client_cores,
                            "server_cores": cpu.server_cores,
                        }
                    )
                    say(f"service: {kind} grpc x{n_proc} C={c}: {out['rows'][-1]}")
            finally:
                for ch in chans:
                    await ch.close()
    finally:
        if kind == "redis":
            await delete_namespace(redis_url, ns)


async def _throughput_inprocess(
    kind: str, params: ServiceParams, redis_url: str, out: dict[str, Any], say: Callable[[str], None]
) -> None:
    """Ceiling: the same operations on the store in-process, one row per C."""
    ns = f"bench-{uuid.uuid4().hex[:12]}"
    store = make_store(kind, redis_url, ns)
    try:
        await store.register([make_problem(i) for i in range(params.problems)])
        for c in params.concurrency:
            s, r = store_fns(store, params, seed=c)
            with CpuMeter([]) as cpu:
                res = await load(c, [(s, r)], params.duration_s, params.warmup_s)
            out["rows"].append(
                {
                    "store": kind,
                    "path": "inprocess",
                    "processes": 0,
                    "clients": c,
                    **res.summary(),
                    "client_cores": cpu.client_cores,
                    "server_cores": None,
                }
            )
            say(f"service: {kind} in-process C={c}: {out['rows'][-1]}")
    finally:
        await store.close()
        if kind == "redis":
            await delete_namespace(redis_url, ns)


def _cpu_ratio(e2e: dict[str, Any], ceil: dict[str, Any]) -> float:
    """CPU seconds per problem of the ceiling loop over those of the server process tree (the
    benchmark client's share left out: it is the lean client, a few % of a core): the ratio of
    rates a machine with a core free for each process would show. Unlike the ratio of rates it
    does not move with the CPU share a loaded machine happens to give each process. NaN when a
    row has no CPU figure (an in-process server) or no rate."""
    if not (e2e["server_cores"] and e2e["sampled_per_s"] and ceil["client_cores"] and ceil["sampled_per_s"]):
        return float("nan")
    return (ceil["client_cores"] / ceil["sampled_per_s"]) / (e2e["server_cores"] / e2e["sampled_per_s"])


def _throughput_ratios(rows: list[dict[str, Any]], kind: str, concurrency: tuple[int, ...]) -> list[dict[str, Any]]:
    """End-to-end rate over the in-process ceiling, per (processes, C) of store ``kind``."""
    ratios = []
    for c in concurrency:
        ceil = next(x for x in rows if x["store"] == kind and x["path"] == "inprocess" and x["clients"] == c)
        for e2e in (x for x in rows if x["store"] == kind and x["path"] == "grpc" and x["clients"] == c):
            ratios.append(
                {
                    "store": kind,
                    "processes": e2e["processes"],
                    "clients": c,
                    "sampled_ratio": e2e["sampled_per_s"] / ceil["sampled_per_s"] if ceil["sampled_per_s"] else float("nan"),
                    "reported_ratio": e2e["reported_per_s"] / ceil["reported_per_s"] if ceil["reported_per_s"] else float("nan"),
                    "cpu_ratio": _cpu_ratio(e2e, ceil),
                }
            )
    return ratios


# -- the benchmark ----------------------------------------------------------------------------
async def run_throughput(
    params: ServiceParams,
    redis_url: str = DEFAULT_REDIS_URL,
    progress: Callable[[str], None] | None = None,
    processes: tuple[int, ...] = (1,),
) -> dict[str, Any]:
    """End-to-end (gRPC) and ceiling (in-process) loops for each store and C, side by side.

    ``processes``: server process counts to measure end to end (values > 1 on Redis only). The
    clients use ``min(C, 16)`` connections, so SO_REUSEPORT can spread them over the processes.
    Each row also has the CPU cores used by the benchmark client and by the server processes.

    Returns:
        {"params", "register_s": {store: s}, "rows": [{store, path, processes, clients,
        sampled_per_s, ..., client_cores, server_cores}], "ratios": [{store, processes, clients,
        sampled_ratio, reported_ratio, cpu_ratio}]} (``cpu_ratio``: :func:`_cpu_ratio`).
    """
    out: dict[str, Any] = {"register_s": {}, "rows": [], "ratios": []}
    say = progress or (lambda s: None)
    for kind in params.stores:
        for n_proc in processes:
            if n_proc > 1 and kind != "redis":
                continue
            await _throughput_grpc(kind, n_proc, params, redis_url, out, say)
        await _throughput_inprocess(kind, params, redis_url, out, say)
        out["ratios"].extend(_throughput_ratios(out["rows"], kind, params.concurrency))
    return out


async def run_redis_memory(
    params: ServiceParams,
    redis_url: str = DEFAULT_REDIS_URL,
    progress: Callable[[str], None] | None = None,
    namespace: str | None = None,
) -> dict[str, Any]:
    """Register ``params.big_register`` problems through gRPC into a Redis-backed server.

    Memory: ``INFO memory`` ``used_memory`` before and after (other clients of the same Redis
    add noise to this difference), and the exact ``MEMORY USAGE … SAMPLES 0`` of this run's
    keys: ``problems`` (the prompts, answers, verifiers: counted separately) and the rest
    (statistics hash, heap sorted set, counters: the per-problem state).

    Returns:
        {"problems", "register_s", "info_delta_bytes", "key_bytes": {name: bytes},
         "state_bytes_per_problem", "prompt_bytes_per_problem", "info_bytes_per_problem"}.
    """
    import redis.asyncio as aioredis

    n = params.big_register
    ns = namespace or f"bench-{uuid.uuid4().hex[:12]}"
    r = aioredis.Redis.from_url(redis_url)
    say = progress or (lambda s: None)
    try:
        async with serve("redis", params, redis_url, ns) as address:
            ch = await channel(address)
            try:
                stub = pb_grpc.PriorityServiceStub(ch)
                await stub.GetStats(pb.GetStatsRequest())  # the server has connected to Redis
                before = int((await r.info("memory"))["used_memory"])
                resp, secs = await register_grpc(stub, n, chunk=2000)
                after = int((await r.info("memory"))["used_memory"])
                assert resp.total == n, resp
            finally:
                await ch.close()
        say(f"service: registered {n} problems into Redis in {secs:.1f}s")
        key_bytes: dict[str, int] = {}
        async for k in r.scan_iter(match=f"*{{{ns}}}*", count=1000):
            name = k.decode().rsplit(":", 1)[-1]
            key_bytes[name] = int(await r.memory_usage(k, samples=0) or 0)
        prompts = key_bytes.get("problems", 0)
        state = sum(v for k, v in key_bytes.items() if k != "problems")
        return {
            "problems": n,
            "register_s": secs,
            "info_delta_bytes": after - before,
            "key_bytes": key_bytes,
            "state_bytes_per_problem": state / n,
            "prompt_bytes_per_problem": prompts / n,
            "info_bytes_per_problem": (after - before) / n,
            "info_state_bytes_per_problem": (after - before - prompts) / n,
        }
    finally:
        await delete_namespace(redis_url, ns)
        await r.aclose()


def plot_service(result: dict[str, Any], path: str) -> None:
    """Sampled problems/s and p99 SampleProblems latency vs C, per store and path (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    rows = result["rows"]
    for kind in dict.fromkeys(x["store"] for x in rows):
        for path_, style in (("grpc", "-o"), ("inprocess", "--s")):
            sel = sorted((x for x in rows if x["store"] == kind and x["path"] == path_), key=lambda x: x["clients"])
            if not sel:
                continue
            label = f"{kind}, {'gRPC end to end' if path_ == 'grpc' else 'in-process ceiling'}"
            cs = [x["clients"] for x in sel]
            ax.plot(cs, [x["sampled_per_s"] for x in sel], style, label=label)
            bx.plot(cs, [x["sample_p99_ms"] for x in sel], style, label=label)
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_xlabel("concurrent clients C")
        a.legend(fontsize=8)
    ax.set_ylabel("problems sampled per second")
    ax.set_title("Throughput of the SampleProblems → ReportOutcomes loop")
    bx.set_yscale("log")
    bx.axhline(20, color="k", ls=":", lw=1)
    bx.set_ylabel("p99 latency of SampleProblems, ms")
    bx.set_title("Tail latency (dotted: the 20 ms target)")
    fig.savefig(path, dpi=100)
    plt.close(fig)


#: Part 1's entry points; its parameters (``ServiceParams``, ``QUICK``, ``DEFAULT_REDIS_URL``) are
#: :mod:`benchmarks.service_load`'s, named here too for part 1's callers.
__all__ = [
    "DEFAULT_REDIS_URL",
    "QUICK",
    "ServiceParams",
    "plot_service",
    "run_redis_memory",
    "run_report_path",
    "run_throughput",
]
