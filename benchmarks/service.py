"""Part 1: throughput and latency of the priority service, and its ceiling.

Workload (the issue's): register P problems; C concurrent asyncio clients each loop
SampleProblems(B) → ReportOutcomes with synthetic outcomes of G completions each (random binary
rewards, ``tokens`` token ids and log-probabilities per completion). Measured per (store, C):
problems sampled per second, outcomes reported per second, p50/p99 latency of each RPC.

The ceiling is the same loop issued to the store in-process (no gRPC, no servicer): the
``MemoryStore`` called directly, and the ``RedisStore`` called directly (its Lua scripts over
redis-py's asyncio connection pool). ``our / ceiling`` is the end-to-end rate divided by the
ceiling rate, both measured in the same run, interleaved: ``--rounds`` times, each C's gRPC row and
then its ceiling row, so each round gives one paired ratio and a busy machine moves both sides
alike; the figures are the rounds' means with 95% t-intervals, and the load average is noted.

Also measured on Redis: memory per problem (``INFO memory`` before/after registering 10^6
problems, and the exact ``MEMORY USAGE`` of this run's keys, prompts separated) and the time to
register 10^6 problems through ``RegisterProblems``.

The workload and load loop are :mod:`benchmarks.service_load`, the servers and stores
:mod:`benchmarks.service_servers`, the open-loop part 1b :mod:`benchmarks.service_openloop`.

Every Redis key this module creates carries a fresh ``bench-<hex>`` namespace and is deleted at
the end (also on errors).
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
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
from prioreplay.intervals import mean_interval
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


@contextlib.asynccontextmanager
async def _grpc_target(
    kind: str, n_proc: int, params: ServiceParams, redis_url: str, out: dict[str, Any], say: Callable[[str], None]
) -> AsyncIterator[Callable[[int], Awaitable[dict[str, Any]]]]:
    """End to end: ``n_proc`` servers with the problems registered over gRPC; yields ``measure(C)``,
    one row of C gRPC clients (the servers' CPU from their process trees)."""
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

                async def measure(c: int) -> dict[str, Any]:
                    fns = [grpc_fns(ch, params, seed=c * 100 + i) for i, ch in enumerate(chans[: min(c, 16)])]
                    with CpuMeter(pids) as cpu:
                        res = await load(c, fns, params.duration_s, params.warmup_s)
                    return _row(kind, "grpc", n_proc, c, res.summary(), cpu)

                yield measure
            finally:
                for ch in chans:
                    await ch.close()
    finally:
        if kind == "redis":
            await delete_namespace(redis_url, ns)


@contextlib.asynccontextmanager
async def _inprocess_target(
    kind: str, params: ServiceParams, redis_url: str
) -> AsyncIterator[Callable[[int], Awaitable[dict[str, Any]]]]:
    """Ceiling: the store in this process with the problems registered; yields ``measure(C)``, one
    row of the same operations issued to the store directly."""
    ns = f"bench-{uuid.uuid4().hex[:12]}"
    store = make_store(kind, redis_url, ns)
    try:
        await store.register([make_problem(i) for i in range(params.problems)])

        async def measure(c: int) -> dict[str, Any]:
            s, r = store_fns(store, params, seed=c)
            with CpuMeter([]) as cpu:
                res = await load(c, [(s, r)], params.duration_s, params.warmup_s)
            return _row(kind, "inprocess", 0, c, res.summary(), cpu)

        yield measure
    finally:
        await store.close()
        if kind == "redis":
            await delete_namespace(redis_url, ns)


def _row(kind: str, path: str, n_proc: int, c: int, summary: dict[str, Any], cpu: CpuMeter) -> dict[str, Any]:
    """One measured row: rates and latencies, the cores used, and the CPU µs per sampled problem
    (the server process tree's end to end, this process's for the in-process ceiling)."""
    cores = cpu.server_cores if path == "grpc" else cpu.client_cores
    rate = summary["sampled_per_s"]
    return {
        "store": kind,
        "path": path,
        "processes": n_proc,
        "clients": c,
        **summary,
        "client_cores": cpu.client_cores,
        "server_cores": cpu.server_cores,
        "cpu_us_per_problem": cores / rate * 1e6 if cores is not None and rate else float("nan"),
    }


def _cpu_ratio(e2e: dict[str, Any], ceil: dict[str, Any]) -> float:
    """CPU seconds per problem of the ceiling loop over those of the server process tree (the
    benchmark client's share left out: it is the lean client, a few % of a core): the ratio of
    rates a machine with a core free for each process would show. Unlike the ratio of rates it
    does not move with the CPU share a loaded machine happens to give each process. NaN when a
    row has no CPU figure (an in-process server) or no rate."""
    if not (e2e["server_cores"] and e2e["sampled_per_s"] and ceil["client_cores"] and ceil["sampled_per_s"]):
        return float("nan")
    return (ceil["client_cores"] / ceil["sampled_per_s"]) / (e2e["server_cores"] / e2e["sampled_per_s"])


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _throughput_ratios(rows: list[dict[str, Any]], kind: str, concurrency: tuple[int, ...]) -> list[dict[str, Any]]:
    """End-to-end over the in-process ceiling per (processes, C) of store ``kind``: each round's
    gRPC row over the same round's ceiling row (measured one after the other, so a busy machine
    moves both alike), then the mean over rounds with a 95% t-interval (``*_ci95``)."""
    ratios = []
    for c in concurrency:
        ceil = {x["round"]: x for x in rows if x["store"] == kind and x["path"] == "inprocess" and x["clients"] == c}
        grpc = [x for x in rows if x["store"] == kind and x["path"] == "grpc" and x["clients"] == c]
        for n_proc in sorted({x["processes"] for x in grpc}):
            pairs = [(x, ceil[x["round"]]) for x in grpc if x["processes"] == n_proc and x["round"] in ceil]
            per_round = {
                "sampled_ratio": [_ratio(e["sampled_per_s"], i["sampled_per_s"]) for e, i in pairs],
                "reported_ratio": [_ratio(e["reported_per_s"], i["reported_per_s"]) for e, i in pairs],
                "cpu_ratio": [_cpu_ratio(e, i) for e, i in pairs],
            }
            entry: dict[str, Any] = {"store": kind, "processes": n_proc, "clients": c, "rounds": len(pairs)}
            for key, values in per_round.items():
                m, lo, hi = mean_interval(values)
                entry[key], entry[f"{key}_ci95"] = m, [lo, hi]
            ratios.append(entry)
    return ratios


def mean_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (store, path, processes, C): each numeric field's mean over the rounds, with the
    rounds counted and the 95% t-interval of the rate and of the CPU per problem (``*_ci95``)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["store"], r["path"], r["processes"], r["clients"]), []).append(r)
    out = []
    for group in groups.values():
        row = dict(group[0])
        for key, value in group[0].items():
            if isinstance(value, float | int) and not isinstance(value, bool) and key not in ("processes", "clients", "round"):
                values = [g[key] for g in group if g[key] is not None]
                row[key] = sum(values) / len(values) if values else None
        for key in ("sampled_per_s", "cpu_us_per_problem"):
            _, lo, hi = mean_interval([g[key] for g in group])
            row[f"{key}_ci95"] = [lo, hi]
        row["rounds"] = len(group)
        row.pop("round", None)
        out.append(row)
    return out


# -- the benchmark ----------------------------------------------------------------------------
async def run_throughput(
    params: ServiceParams,
    redis_url: str = DEFAULT_REDIS_URL,
    progress: Callable[[str], None] | None = None,
    processes: tuple[int, ...] = (1,),
    rounds: int = 1,
) -> dict[str, Any]:
    """End-to-end (gRPC) and ceiling (in-process) loops for each store and C, interleaved.

    Per store, the servers (``processes``: server process counts measured end to end, values > 1
    on Redis only) and the in-process store are started once; then ``rounds`` times, for each C,
    every gRPC configuration and then the ceiling are measured one after the other (A B A B), so a
    load that comes and goes moves both sides of a ratio alike. The clients use ``min(C, 16)``
    connections, so SO_REUSEPORT can spread them over the processes. The 1-minute load average is
    read before and after (``load``).

    Raises:
        ValueError: ``rounds`` < 1.

    Returns:
        {"register_s": {store: s}, "rows": [{store, path, processes, clients, round, sampled_per_s,
        ..., client_cores, server_cores, cpu_us_per_problem}] (one per round), "mean_rows" (the
        rounds' means, :func:`mean_rows`), "ratios": [{store, processes, clients, rounds,
        sampled_ratio, reported_ratio, cpu_ratio and their ``*_ci95``}], "load": [before, after]}
        (``cpu_ratio``: :func:`_cpu_ratio`, per round).
    """
    if rounds < 1:
        raise ValueError(f"rounds ({rounds}) must be >= 1")
    out: dict[str, Any] = {"register_s": {}, "rows": [], "ratios": [], "rounds": rounds, "load": [os.getloadavg()[0]]}
    say = progress or (lambda s: None)
    for kind in params.stores:
        async with contextlib.AsyncExitStack() as stack:
            targets = [
                await stack.enter_async_context(_grpc_target(kind, n, params, redis_url, out, say))
                for n in processes
                if n == 1 or kind == "redis"
            ]
            targets.append(await stack.enter_async_context(_inprocess_target(kind, params, redis_url)))
            for r in range(rounds):
                for c in params.concurrency:
                    for measure in targets:
                        row = {**await measure(c), "round": r}
                        out["rows"].append(row)
                        say(f"service: round {r} {kind} {row['path']} x{row['processes']} C={c}: {row}")
        out["ratios"].extend(_throughput_ratios(out["rows"], kind, params.concurrency))
    out["mean_rows"] = mean_rows(out["rows"])
    out["load"].append(os.getloadavg()[0])
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
    rows = result.get("mean_rows", result["rows"])
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
