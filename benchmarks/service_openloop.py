"""Part 1b: open-loop latency at fixed offered loads (``benchmarks.run --parts openloop``).

Simulated workers lease a batch every ``period_s`` whatever the server's answers, so a slow
answer does not lower the offered load; latency is measured from the scheduled tick (no
coordinated omission).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from benchmarks.service_load import DEFAULT_REDIS_URL, ReportFn, SampleFn, ServiceParams, grpc_fns
from benchmarks.service_servers import (
    CpuMeter,
    connections,
    delete_namespace,
    register_grpc,
    serve,
)
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc


# -- open loop --------------------------------------------------------------------------------
def _tick_schedule(
    workers: int, period_s: float, t0: float, warmup_s: float, duration_s: float, seed: int
) -> list[tuple[float, int]]:
    """Sorted (scheduled time, worker) ticks from ``t0`` to the window's end: a random phase, then every ``period_s``."""
    rng = np.random.default_rng(seed)
    stop = t0 + warmup_s + duration_s
    return sorted(
        (t0 + ph + k * period_s, w)
        for w, ph in enumerate(rng.random(workers) * period_s)
        for k in range(int((warmup_s + duration_s) / period_s) + 1)
        if t0 + ph + k * period_s < stop
    )


def _open_loop_summary(
    sampled_per_s: float, sample_lat: list[float], report_lat: list[float], lag: list[float], unfinished: int
) -> dict[str, Any]:
    """The open-loop result dict: latencies (seconds in) as p50/p99/p99.9 milliseconds."""
    pct = lambda a, q: float(np.percentile(np.asarray(a) * 1e3, q)) if a else float("nan")  # noqa: E731
    return {
        "sampled_per_s": sampled_per_s,
        "ticks": len(sample_lat),
        "sample_p50_ms": pct(sample_lat, 50),
        "sample_p99_ms": pct(sample_lat, 99),
        "sample_p999_ms": pct(sample_lat, 99.9),
        "report_p50_ms": pct(report_lat, 50),
        "report_p99_ms": pct(report_lat, 99),
        "report_p999_ms": pct(report_lat, 99.9),
        "lag_p99_ms": pct(lag, 99),
        "unfinished": unfinished,
    }


async def open_loop(
    fns: list[tuple[SampleFn, ReportFn]], workers: int, period_s: float, duration_s: float, warmup_s: float, seed: int = 0
) -> dict[str, Any]:
    """A fixed offered load: ``workers`` simulated workers, each leasing a batch every ``period_s``.

    Worker ``w`` starts at a random phase in [0, period_s) and then ticks every ``period_s``
    whatever the server's answers (open loop: a slow answer does not lower the offered load). At
    each tick it calls SampleProblems and, as soon as the lease arrives, ReportOutcomes for it
    (the report a worker would send after generating). Ticks scheduled in the measured window
    count. SampleProblems latency is measured from the *scheduled* tick (client-side delay
    included, so no coordinated omission); ``lag`` is how late the client's loop issued the call.

    Returns:
        {"sampled_per_s", "ticks", "sample_p50_ms", "sample_p99_ms",
        "sample_p999_ms", "report_p50_ms", "report_p99_ms", "report_p999_ms", "lag_p99_ms",
        "unfinished"}: ``unfinished`` ticks were still running 30 s after the window.
    """
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.1
    start = t0 + warmup_s
    ticks = _tick_schedule(workers, period_s, t0, warmup_s, duration_s, seed)
    sample_lat: list[float] = []
    report_lat: list[float] = []
    lag: list[float] = []
    sampled = 0

    async def tick(t_sched: float, w: int) -> None:
        nonlocal sampled
        sample, report = fns[w % len(fns)]
        issued = loop.time()
        lease_id, ids = await sample()
        got = loop.time()
        if ids:
            await report(lease_id, ids)
        done = loop.time()
        if t_sched >= start:
            lag.append(issued - t_sched)
            sample_lat.append(got - t_sched)
            sampled += len(ids)
            if ids:
                report_lat.append(done - got)

    tasks = []
    for t_sched, w in ticks:
        delay = t_sched - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(tick(t_sched, w)))
    done, pending = await asyncio.wait(tasks, timeout=30.0) if tasks else (set(), set())
    for t in pending:
        t.cancel()
    for t in done:
        t.result()  # a refused report is a benchmark error
    return _open_loop_summary(sampled / duration_s, sample_lat, report_lat, lag, len(pending))


async def run_open_loop(
    params: ServiceParams,
    redis_url: str = DEFAULT_REDIS_URL,
    progress: Callable[[str], None] | None = None,
    workers: int = 64,
    period_s: float = 10.0,
    loads: tuple[float, ...] = (1, 2, 4, 6, 8, 10),
    processes: tuple[int, ...] = (1,),
    p99_limit_ms: float = 50.0,
) -> dict[str, Any]:
    """Open-loop sweeps: ``workers`` × each of ``loads`` simulated workers leasing ``batch_size``
    problems every ``period_s`` (offered load = workers × load × B / period_s problems/s), per
    store and server process count. A sweep stops after the first load whose SampleProblems p99
    exceeds 20 × ``p99_limit_ms`` (saturated: higher loads only queue more).

    Returns:
        {"rows": [{store, processes, load, workers, offered_problems_per_s, ...open_loop keys,
        client_cores, server_cores}], "sustained": [{store, processes, max_offered_problems_per_s}]}:
        the highest offered load whose SampleProblems and ReportOutcomes p99 were both <= ``p99_limit_ms``
        and whose achieved rate was >= 95% of the offered one.
    """
    say = progress or (lambda s: None)
    out: dict[str, Any] = {"rows": [], "sustained": [], "workers": workers, "period_s": period_s, "p99_limit_ms": p99_limit_ms}
    for kind in params.stores:
        for n_proc in processes:
            if n_proc > 1 and kind != "redis":
                continue
            ns = f"bench-{uuid.uuid4().hex[:12]}"
            try:
                sweep = _OpenLoopSweep(kind, n_proc, workers, period_s, p99_limit_ms)
                best = await sweep.run(params, redis_url, ns, loads, out["rows"], say)
            finally:
                if kind == "redis":
                    await delete_namespace(redis_url, ns)
            out["sustained"].append({"store": kind, "processes": n_proc, "max_offered_problems_per_s": best})
    return out


@dataclass
class _OpenLoopSweep:
    """One store and process count of :func:`run_open_loop`: the loads in turn on one server."""

    kind: str
    n_proc: int
    workers: int
    period_s: float
    p99_limit_ms: float

    async def run(
        self, params: ServiceParams, redis_url: str, ns: str, loads: tuple[float, ...], rows: list, say: Callable[[str], None]
    ) -> float:
        """Append a row per load to ``rows``; return the highest sustained offered load (problems/s)."""
        pids: list[int] = []
        best = 0.0
        async with serve(
            self.kind, replace(params, server="subprocess"), redis_url, ns, processes=self.n_proc, pids=pids
        ) as address:
            chans = await connections(address, 16)
            try:
                resp, _ = await register_grpc(pb_grpc.PriorityServiceStub(chans[0]), params.problems)
                assert resp.total == params.problems, resp
                for load_x in loads:
                    row = await self.one_load(params, chans, pids, load_x)
                    rows.append(row)
                    say(f"service open loop: {self.kind} x{self.n_proc} load {load_x}: {row}")
                    if self.sustained(row):
                        best = max(best, row["offered_problems_per_s"])
                    if not (row["sample_p99_ms"] <= 20 * self.p99_limit_ms):
                        break  # saturated: higher loads only queue more
            finally:
                for ch in chans:
                    await ch.close()
        return best

    async def one_load(self, params: ServiceParams, chans: list[Any], pids: list[int], load_x: float) -> dict[str, Any]:
        """One load: ``workers`` × ``load_x`` simulated workers; the row of :func:`run_open_loop`."""
        w = int(round(self.workers * load_x))
        fns = [grpc_fns(ch, params, seed=i) for i, ch in enumerate(chans)]
        with CpuMeter(pids) as cpu:
            r = await open_loop(fns, w, self.period_s, params.duration_s, params.warmup_s, seed=w)
        return {
            "store": self.kind,
            "processes": self.n_proc,
            "load": load_x,
            "workers": w,
            "offered_problems_per_s": w * params.batch_size / self.period_s,
            **r,
            "client_cores": cpu.client_cores,
            "server_cores": cpu.server_cores,
        }

    def sustained(self, row: dict[str, Any]) -> bool:
        """Both p99 within the limit, >= 95% of the offered rate achieved, nothing left unfinished."""
        lim = self.p99_limit_ms
        return (
            row["sample_p99_ms"] <= lim
            and row["report_p99_ms"] <= lim
            and row["sampled_per_s"] >= 0.95 * row["offered_problems_per_s"]
            and not row["unfinished"]
        )
