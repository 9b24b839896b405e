"""Part 1f: latency from a report to the learner receiving its group, polled vs woken, side by side.

A learner waits in ``PullTrajectories(wait_s)`` while a worker leases one problem at a time and
reports it with a mixed group (so it is queued), after a random pause (seeded, uniform in
``gap_s``) that starts when the learner has the previous group, so the learner is waiting when
the report comes. Measured per report: the time from the store accepting the report (its
``Store.report`` returned, in the server) to the learner's pull answering with that group. The
report's round trip as the worker sees it is given beside it.

Two servers per store, both in this process (``create_server``, one event loop with the clients):

* ``woken``: the server as it is (a waiting pull is woken by the report: memory an
  ``asyncio.Event``, Redis ``XREAD BLOCK``);
* ``polled``: the same server whose store's waiting pull polls with the backoff the service used
  before (sleeps of 5 ms doubling to 100 ms between pulls), the baseline.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.service_load import DEFAULT_REDIS_URL
from benchmarks.service_servers import channel, delete_namespace, make_store
from prioreplay.priority_server.store import Store
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc

#: The poll backoff PullTrajectories used before it was woken: first and longest sleep, seconds.
POLL_BACKOFF_S = (0.005, 0.1)
MODES = ("polled", "woken")


@dataclass(frozen=True)
class PullLatencyParams:
    """Sizes of the pull-latency benchmark.

    Attributes:
        reports: reports (one group each) measured per (store, mode).
        gap_s: (low, high) seconds the worker pauses before each report, uniform.
        wait_s: the learner's ``wait_s`` per pull, seconds.
        tokens: generated tokens per completion (G = 2 completions, rewards 1 and 0).
        stores: "memory" and/or "redis".
    """

    reports: int = 100
    gap_s: tuple[float, float] = (0.005, 0.05)
    wait_s: float = 5.0
    tokens: int = 64
    stores: tuple[str, ...] = ("memory", "redis")


QUICK = PullLatencyParams(reports=10, stores=("memory",))


def poll_like_before(store: Store) -> Store:
    """Make ``store``'s waiting pull poll with :data:`POLL_BACKOFF_S` (the earlier servicer loop)."""
    pull_now = store.pull

    async def polled(consumer: str, max_groups: int, include_own_pending: bool = False, wait_s: float = 0.0) -> Any:
        deadline = time.monotonic() + wait_s
        sleep_s = POLL_BACKOFF_S[0]
        while True:
            out = await pull_now(consumer, max_groups, include_own_pending)
            include_own_pending = False
            left = deadline - time.monotonic()
            if out or left <= 0:
                return out
            await asyncio.sleep(min(sleep_s, left))
            sleep_s = min(sleep_s * 2, POLL_BACKOFF_S[1])

    store.pull = polled  # type: ignore[method-assign]  # the baseline, on this instance only
    return store


def stamp_accepted(store: Store, accepted: dict[str, float]) -> None:
    """Record in ``accepted`` the time (perf_counter s) each reported group's report was accepted by ``store``."""
    report = store.report

    async def stamped(lease_id: str, outcomes: Any, **kw: Any) -> Any:
        r = await report(lease_id, outcomes, **kw)
        t = time.perf_counter()
        if r.accepted:
            accepted.update((o.problem_id, t) for o in outcomes)
        return r

    store.report = stamped  # type: ignore[method-assign,assignment]  # measuring, on this instance only


def outcome(problem_id: str, tokens: int) -> pb.ProblemOutcome:
    """A mixed group of two completions (rewards 1 and 0) of ``tokens`` tokens each."""
    comps = [pb.Completion(reward=r, token_ids=[7] * tokens, logprobs=[-0.5] * tokens) for r in (1.0, 0.0)]
    return pb.ProblemOutcome(problem_id=problem_id, prompt_token_ids=[1, 2, 3], completions=comps)


async def _learner(stub: Any, n: int, wait_s: float, sent: dict[str, float], out: list[float], got: asyncio.Queue) -> None:
    while len(out) < n:
        r = await stub.PullTrajectories(pb.PullTrajectoriesRequest(max_groups=8, wait_s=wait_s, consumer="bench"))
        t = time.perf_counter()
        out.extend(t - sent.pop(g.problem_id) for g in r.groups)
        if r.groups:
            await stub.AckTrajectories(pb.AckTrajectoriesRequest(group_ids=[g.group_id for g in r.groups]))
            got.put_nowait(len(r.groups))


async def _worker(stub: Any, p: PullLatencyParams, seed: int, rtt: list[float], got: asyncio.Queue) -> None:
    rng = np.random.default_rng(seed)
    for i in range(p.reports):
        if i:
            await got.get()  # the learner has the previous group and waits again: the pause starts
        lease = await stub.SampleProblems(pb.SampleProblemsRequest(batch_size=1, worker_id="bench"))
        pid = lease.problems[0].problem.id
        await asyncio.sleep(float(rng.uniform(*p.gap_s)))
        req = pb.ReportOutcomesRequest(lease_id=lease.lease_id, worker_id="bench", outcomes=[outcome(pid, p.tokens)])
        t0 = time.perf_counter()
        r = await stub.ReportOutcomes(req)
        rtt.append(time.perf_counter() - t0)
        if r.groups_queued != 1:
            raise RuntimeError(f"report not queued: {r}")


async def measure(kind: str, mode: str, p: PullLatencyParams, redis_url: str, seed: int = 0) -> dict[str, Any]:
    """One (store, mode): report-to-receipt latency p50/p99 and the report round trip p50, ms."""
    from prioreplay.priority_server.config import ServerConfig
    from prioreplay.priority_server.server import create_server, stop_server

    ns = f"bench-{uuid.uuid4().hex[:10]}"
    store = make_store(kind, redis_url, ns, seed)
    if mode == "polled":
        poll_like_before(store)
    sent: dict[str, float] = {}
    stamp_accepted(store, sent)
    server, port = await create_server("127.0.0.1:0", store, ServerConfig(max_queue_depth=0))
    lat: list[float] = []
    rtt: list[float] = []
    try:
        chs = [await channel(f"127.0.0.1:{port}") for _ in range(2)]
        worker, learner = (pb_grpc.PriorityServiceStub(ch) for ch in chs)
        problems = [pb.Problem(id=f"p{i}", prompt="q", answer="1") for i in range(16)]
        await worker.RegisterProblems(iter([pb.RegisterProblemsRequest(problems=problems)]))
        got: asyncio.Queue = asyncio.Queue()
        await asyncio.gather(_learner(learner, p.reports, p.wait_s, sent, lat, got), _worker(worker, p, seed, rtt, got))
        for ch in chs:
            await ch.close()
    finally:
        await stop_server(server, grace_s=1.0)
        await store.close()
        if kind == "redis":
            await delete_namespace(redis_url, ns)
    ms = np.asarray(lat) * 1e3
    return {
        "store": kind,
        "mode": mode,
        "reports": len(lat),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "report_rtt_p50_ms": float(np.percentile(np.asarray(rtt) * 1e3, 50)),
    }


async def run_pull_latency(p: PullLatencyParams = PullLatencyParams(), redis_url: str = DEFAULT_REDIS_URL) -> dict[str, Any]:
    """Both modes for each store, one after the other in this run. Returns ``{"rows": [...]}``."""
    rows = [await measure(kind, mode, p, redis_url) for kind in p.stores for mode in MODES]
    return {"rows": rows, "params": {"reports": p.reports, "gap_s": list(p.gap_s), "tokens": p.tokens}}


async def run_seeds(seeds: int, p: PullLatencyParams = PullLatencyParams(), redis_url: str = DEFAULT_REDIS_URL) -> list[dict]:
    """Both modes for each store, per seed ``0..seeds-1`` (the modes side by side within a seed);
    per store and mode the mean over seeds of p50 and p99 with a 95% t-interval."""
    from prioreplay.intervals import mean_interval

    rows = [await measure(kind, mode, p, redis_url, seed) for seed in range(seeds) for kind in p.stores for mode in MODES]
    out = []
    for kind in p.stores:
        for mode in MODES:
            mine = [r for r in rows if r["store"] == kind and r["mode"] == mode]
            figs = {k: mean_interval([r[k] for r in mine]) for k in ("p50_ms", "p99_ms")}
            out.append({"store": kind, "mode": mode, "seeds": seeds, **figs})
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.pull_latency [--seeds N]``: print the table (one seed: as measured;
    several: mean [95% interval] over seeds). results.json: ``benchmarks.run --parts pulllatency``."""
    import argparse

    ap = argparse.ArgumentParser(description="report → learner latency, polled vs woken pulls, side by side")
    ap.add_argument("--seeds", type=int, default=1, help="seeds of the report pauses (each runs every store and mode)")
    a = ap.parse_args(argv)
    if a.seeds > 1:
        for r in asyncio.run(run_seeds(a.seeds)):
            (m50, lo50, hi50), (m99, lo99, hi99) = r["p50_ms"], r["p99_ms"]
            p50, p99 = f"{m50:6.2f} [{lo50:.2f}, {hi50:.2f}]", f"{m99:6.2f} [{lo99:.2f}, {hi99:.2f}]"
            print(f"{r['store']:6} {r['mode']:6} p50 {p50} ms  p99 {p99} ms  ({r['seeds']} seeds)")
        return
    for r in asyncio.run(run_pull_latency())["rows"]:
        print(
            f"{r['store']:6} {r['mode']:6} p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  "
            f"(report round trip p50 {r['report_rtt_p50_ms']:.2f} ms, n={r['reports']})"
        )


if __name__ == "__main__":
    main()
