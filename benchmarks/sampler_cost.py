"""SampleProblems(B) latency of each sampler over gRPC, side by side with a baseline server.

``python -m benchmarks.sampler_cost --samplers heap,screened,posterior,gumbel [--baseline-pythonpath DIR]``

Runs part 1's end-to-end loop (``benchmarks.service``: a ``prioreplay server`` subprocess, P
problems registered over gRPC, one client doing SampleProblems(B) → ReportOutcomes) for every
store and sampler, at C = 1, and prints/returns the p50/p99 of SampleProblems. With
``--baseline-pythonpath DIR`` the server is also run once per store from the code importable
under DIR (e.g. the main branch laid out as the installed package: ``prioreplay/`` with each
``services/<role>/`` copied to ``prioreplay/<role>/``), with its default sampler, before and after
the candidates, so the ratio to the baseline is measured in the same conditions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from dataclasses import replace
from typing import Any

from benchmarks.service_load import DEFAULT_REDIS_URL, ServiceParams, grpc_fns, load
from benchmarks.service_servers import channel, delete_namespace, register_grpc, serve
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc


async def measure(
    kind: str, sampler: str | None, params: ServiceParams, redis_url: str, pythonpath: str | None = None
) -> dict[str, Any]:
    """One (store, sampler) configuration: register, then the C = 1 loop. ``sampler`` None: the
    server's default; ``pythonpath``: the server subprocess imports its code from there."""
    env_before = {k: os.environ.get(k) for k in ("PYTHONPATH", "PRIOREPLAY_SAMPLER")}
    if pythonpath:
        os.environ["PYTHONPATH"] = pythonpath
    if sampler:
        os.environ["PRIOREPLAY_SAMPLER"] = sampler
    ns = f"bench-{uuid.uuid4().hex[:12]}"
    try:
        async with serve(kind, params, redis_url, ns) as address:
            ch = await channel(address)
            try:
                stub = pb_grpc.PriorityServiceStub(ch)
                await register_grpc(stub, params.problems)
                s, r = grpc_fns(stub, params, seed=1)
                res = await load(1, [(s, r)], params.duration_s, params.warmup_s)
            finally:
                await ch.close()
    finally:
        for k, v in env_before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if kind == "redis":
            await delete_namespace(redis_url, ns)
    return {"store": kind, "sampler": sampler or "default", "baseline": bool(pythonpath), **res.summary()}


async def run(
    samplers: list[str], stores: list[str], params: ServiceParams, redis_url: str, baseline: str | None
) -> list[dict[str, Any]]:
    rows = []
    for kind in stores:
        plan = ([(None, baseline)] if baseline else []) + [(s, None) for s in samplers] + ([(None, baseline)] if baseline else [])
        for sampler, path in plan:
            rows.append(await measure(kind, sampler, params, redis_url, path))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.sampler_cost", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--samplers", default="heap,screened,posterior,gumbel")
    ap.add_argument("--stores", default="memory,redis")
    ap.add_argument("--problems", type=int, default=100_000)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--duration-s", type=float, default=10.0)
    ap.add_argument("--baseline-pythonpath", default=None)
    ap.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    params = replace(
        ServiceParams(),
        problems=args.problems,
        batch_size=args.batch_size,
        concurrency=(1,),
        duration_s=args.duration_s,
        server="subprocess",
    )
    rows = asyncio.run(run(args.samplers.split(","), args.stores.split(","), params, args.redis_url, args.baseline_pythonpath))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
