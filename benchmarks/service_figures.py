"""Parts 1, 1b, 1c, 1d and 1f of ``python -m benchmarks.run``: the priority service measured
(:mod:`benchmarks.service`, :mod:`benchmarks.pull_latency`, :mod:`benchmarks.replica_acks`) and
written as results.json figures (``service.*``, ``redis.*``, ``openloop.*``, ``reportpath.*``,
``replicaacks.*``). docs/METHOD.md, "How the figures are measured", explains each figure.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.results import Results
from benchmarks.results import log as _log


def part_service(args: argparse.Namespace, res: Results) -> dict[str, Any]:
    from benchmarks import service

    params = service.QUICK if args.quick else service.ServiceParams()
    params = replace(params, stores=tuple(args.stores.split(",")))
    if args.duration_s:
        params = replace(params, duration_s=args.duration_s)
    if args.server:
        params = replace(params, server=args.server)
    if args.no_big_register:
        params = replace(params, big_register=0)
    procs = tuple(int(x) for x in args.processes.split(","))
    out = asyncio.run(service.run_throughput(params, args.redis_url, progress=_log, processes=procs, rounds=args.rounds))
    _service_figures(res, params, out)
    if "redis" in params.stores and params.big_register:
        out["redis_memory"] = _redis_memory_figures(
            res, asyncio.run(service.run_redis_memory(params, args.redis_url, progress=_log))
        )
    if args.plot_dir:
        res.plot(Path(args.plot_dir) / "bench_service.png", lambda path: service.plot_service(out, path))
    return out


#: Per path: the name of its CPU-per-problem figure and how it is measured.
_CPU_FIGURES = {
    "grpc": ("server", "server process tree CPU s / problems sampled, end to end over gRPC"),
    "inprocess": ("ceiling", "in-process loop's CPU s / problems sampled (the store called directly)"),
}


def _service_figures(res: Results, params: Any, out: dict[str, Any]) -> None:
    """Part 1's figures: registration time, rates and latencies per row (the rounds' means), CPU µs
    per problem, ratios with their 95% intervals over rounds, processes scaling; each with the
    rounds and the load average before and after the run."""
    run = {"rounds": out.get("rounds", 1), "load_1m": out.get("load")}
    for kind, secs in out["register_s"].items():
        res.add(f"service.{kind}.register_{params.problems}_s", secs, "s", problems=params.problems)
    rows = out.get("mean_rows", out["rows"])
    for row in rows:
        x = f".x{row['processes']}" if row["processes"] > 1 else ""
        pre = f"service.{row['store']}.{row['path']}{x}.c{row['clients']}"
        res.add(f"{pre}.sampled_per_s", row["sampled_per_s"], "problems/s", ci95=row.get("sampled_per_s_ci95"), **run)
        res.add(f"{pre}.reported_per_s", row["reported_per_s"], "outcomes/s", **run)
        for k in ("sample_p50_ms", "sample_p99_ms", "report_p50_ms", "report_p99_ms"):
            res.add(f"{pre}.{k}", row[k], "ms", rpcs=row["rpcs"], **run)
        res.add(f"{pre}.client_cores", row["client_cores"], "cores", how="benchmark process CPU s / wall s", **run)
        if row["server_cores"] is not None:
            res.add(f"{pre}.server_cores", row["server_cores"], "cores", how="server process tree CPU s / wall s", **run)
        side, how = _CPU_FIGURES[row["path"]]
        res.add(
            f"service.{row['store']}{x}.c{row['clients']}.{side}_cpu_us_per_problem",
            row["cpu_us_per_problem"],
            "µs",
            ci95=row.get("cpu_us_per_problem_ci95"),
            how=how,
            **run,
        )
    for r in out["ratios"]:
        x = f".x{r['processes']}" if r["processes"] > 1 else ""
        pre = f"service.{r['store']}{x}.c{r['clients']}"
        how = "per round: the gRPC row over the same round's in-process row, measured one after the other"
        res.add(f"{pre}.e2e_over_ceiling_sampled", r["sampled_ratio"], "ratio", ci95=r.get("sampled_ratio_ci95"), how=how, **run)
        res.add(
            f"{pre}.e2e_over_ceiling_reported", r["reported_ratio"], "ratio", ci95=r.get("reported_ratio_ci95"), how=how, **run
        )
        res.add(
            f"{pre}.e2e_over_ceiling_cpu",
            r["cpu_ratio"],
            "ratio",
            ci95=r.get("cpu_ratio_ci95"),
            how="ceiling CPU s per problem / server process tree CPU s per problem, " + how,
            **run,
        )
    grpc_rows = [x for x in rows if x["path"] == "grpc"]
    for row in grpc_rows:
        one = next(
            (x for x in grpc_rows if x["store"] == row["store"] and x["processes"] == 1 and x["clients"] == row["clients"]),
            None,
        )
        if one and row["processes"] > 1:
            res.add(
                f"service.{row['store']}.x{row['processes']}_over_x1.c{row['clients']}.sampled",
                row["sampled_per_s"] / one["sampled_per_s"],
                "ratio",
                **run,
            )


def _redis_memory_figures(res: Results, mem: dict[str, Any]) -> dict[str, Any]:
    """Part 1's Redis memory per problem and registration time of 10^6 problems; returns ``mem``."""
    n = mem["problems"]
    res.add(f"redis.register_{n}_s", mem["register_s"], "s", problems=n)
    how = "MEMORY USAGE SAMPLES 0 of the run's keys except 'problems'"
    res.add(f"redis.state_bytes_per_problem_{n}", mem["state_bytes_per_problem"], "bytes", keys=mem["key_bytes"], how=how)
    how = "MEMORY USAGE SAMPLES 0 of the 'problems' hash"
    res.add(f"redis.prompt_bytes_per_problem_{n}", mem["prompt_bytes_per_problem"], "bytes", how=how)
    how = "INFO memory used_memory after - before registration, all keys"
    res.add(f"redis.info_bytes_per_problem_{n}", mem["info_bytes_per_problem"], "bytes", how=how)
    how = "INFO delta minus the 'problems' hash"
    res.add(f"redis.info_state_bytes_per_problem_{n}", mem["info_state_bytes_per_problem"], "bytes", how=how)
    return mem


def part_openloop(args: argparse.Namespace, res: Results) -> dict[str, Any]:
    """Part 1b: open-loop latency at fixed offered loads (and the highest load with p99 <= 50 ms)."""
    from benchmarks import service_load, service_openloop

    params = service_load.QUICK if args.quick else service_load.ServiceParams(duration_s=30.0, warmup_s=5.0)
    params = replace(params, stores=tuple(args.stores.split(",")))
    if args.duration_s:
        params = replace(params, duration_s=args.duration_s)
    loads = tuple(float(x) for x in args.open_loads.split(","))
    procs = tuple(int(x) for x in args.processes.split(","))
    out = asyncio.run(
        service_openloop.run_open_loop(
            params,
            args.redis_url,
            progress=_log,
            workers=args.open_workers,
            period_s=args.open_period_s,
            loads=loads,
            processes=procs,
        )
    )
    for row in out["rows"]:
        pre = f"openloop.{row['store']}.x{row['processes']}.load{row['load']:g}"
        extra = {
            "workers": row["workers"],
            "period_s": args.open_period_s,
            "batch_size": params.batch_size,
            "ticks": row["ticks"],
        }
        res.add(f"{pre}.offered_problems_per_s", row["offered_problems_per_s"], "problems/s", **extra)
        res.add(f"{pre}.sampled_per_s", row["sampled_per_s"], "problems/s", **extra)
        for k in (
            "sample_p50_ms",
            "sample_p99_ms",
            "sample_p999_ms",
            "report_p50_ms",
            "report_p99_ms",
            "report_p999_ms",
            "lag_p99_ms",
        ):
            res.add(f"{pre}.{k}", row[k], "ms", **extra)
        res.add(f"{pre}.client_cores", row["client_cores"], "cores", **extra)
        res.add(f"{pre}.server_cores", row["server_cores"], "cores", **extra)
    for r in out["sustained"]:
        res.add(
            f"openloop.{r['store']}.x{r['processes']}.max_sustained_problems_per_s",
            r["max_offered_problems_per_s"],
            "problems/s",
            how=f"highest offered load with Sample and Report p99 <= {out['p99_limit_ms']:g} ms and >= 95% of it served",
            loads=list(loads),
        )
    return out


def part_reportpath(args: argparse.Namespace, res: Results) -> dict[str, Any]:
    """Part 1c: server-side ReportOutcomes handling, per-field path vs lean path, side by side."""
    from benchmarks import service

    params = service.QUICK if args.quick else service.ServiceParams()
    out = service.run_report_path(params, reports=5 if args.quick else 20, rounds=3 if args.quick else 9)
    extra = {
        "batch_size": params.batch_size,
        "group_size": params.group_size,
        "tokens": params.tokens,
        "request_bytes": out["request_bytes"],
        "rounds": out["rounds"],
    }
    res.add("reportpath.per_field_ms_per_report", out["per_field_ms"], "ms", **extra)
    res.add("reportpath.lean_ms_per_report", out["lean_ms"], "ms", **extra)
    res.add("reportpath.speedup", out["speedup"], "ratio", **extra)
    return out


def part_pulllatency(args: argparse.Namespace, res: Results) -> dict[str, Any]:
    """Part 1f: report-to-learner latency of a waiting PullTrajectories, polled (before) vs woken, per store.

    ``service.pull_latency_p50_ms`` / ``_p99_ms`` are the woken figures of the slower store.
    """
    from benchmarks import pull_latency

    p = pull_latency.QUICK if args.quick else pull_latency.PullLatencyParams()
    p = replace(p, stores=tuple(args.stores.split(",")))
    out = asyncio.run(pull_latency.run_pull_latency(p, args.redis_url))
    for r in out["rows"]:
        for k in ("p50_ms", "p99_ms", "report_rtt_p50_ms"):
            res.add(f"service.pull_latency.{r['store']}.{r['mode']}.{k}", r[k], "ms", reports=r["reports"])
    woken = max((r for r in out["rows"] if r["mode"] == "woken"), key=lambda r: r["p50_ms"])
    for k in ("p50_ms", "p99_ms"):
        res.add(f"service.pull_latency_{k}", woken[k], "ms", store=woken["store"], how="accepted report to learner receipt")
    return out


def part_replicaacks(args: argparse.Namespace, res: Results) -> dict[str, Any]:
    """Part 1d: the store's report call without and with ``min_replica_acks`` 1 (a local replica)."""
    from benchmarks import replica_acks

    out = replica_acks.run(rounds=20 if args.quick else 200, blocks=2 if args.quick else 4)
    extra = {
        "batch_size": out["batch_size"],
        "group_size": out["group_size"],
        "reports": out["reports"],
        "how": "RedisStore.report of B problems x G rewards with payloads; primary and replica on one machine",
    }
    for name in ("acks0_50_ms", "acks0_90_ms", "acks1_50_ms", "acks1_90_ms", "added_p50_ms"):
        res.add(f"replicaacks.{name}", out[name], "ms", **extra)
    return out
