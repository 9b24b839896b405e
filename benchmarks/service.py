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

Every Redis key this module creates carries a fresh ``bench-<hex>`` namespace and is deleted at
the end (also on errors).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from prioreplay.channel import free_port
from prioreplay.convert import problem_to_proto
from prioreplay.priority_server.store import Store, StoreConfig
from prioreplay.priority_server.store.records import GroupOutcome
from prioreplay.priority_server.wire import encode_varint
from prioreplay.problems import ProblemRecord
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc

DEFAULT_REDIS_URL = os.environ.get("PRIOREPLAY_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
#: gRPC message limit of the benchmark's channels, bytes.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ServiceParams:
    """Sizes of the service benchmark.

    Attributes:
        problems: P, problems registered before the load loop.
        batch_size: B, problems per SampleProblems.
        group_size: G, completions per reported problem.
        tokens: generated tokens per completion (token ids + float32 log-probs each).
        prompt_tokens: prompt token ids per reported group.
        concurrency: the values of C (concurrent clients).
        duration_s: measured seconds per (store, C, path), after ``warmup_s``.
        warmup_s: seconds of load before measuring starts.
        stores: "memory" and/or "redis".
        server: "subprocess" (``prioreplay server`` in its own process) or "inprocess"
            (``create_server`` in this process's event loop).
        big_register: problems of the Redis memory/registration test (0 skips it).
    """

    problems: int = 100_000
    batch_size: int = 256
    group_size: int = 8
    tokens: int = 16
    prompt_tokens: int = 48
    concurrency: tuple[int, ...] = (1, 8, 64)
    duration_s: float = 10.0
    warmup_s: float = 2.0
    stores: tuple[str, ...] = ("memory", "redis")
    server: str = "subprocess"
    big_register: int = 1_000_000


QUICK = ServiceParams(
    problems=2_000, batch_size=32, concurrency=(1, 4), duration_s=0.6, warmup_s=0.2, server="inprocess", big_register=5_000
)


def make_problem(i: int) -> ProblemRecord:
    """Synthetic problem ``i``: a GSM8K-sized prompt (~130 bytes) and a short answer."""
    return ProblemRecord(
        id=f"bench-{i:07d}",
        prompt=f"A shop sells {i % 97 + 3} pencils for {i % 13 + 2} dollars each and gives a "
        f"discount of {i % 9 + 1} dollars on the total. What does a customer pay?",
        answer=str((i % 97 + 3) * (i % 13 + 2) - (i % 9 + 1)),
        verifier="exact",
    )


# -- synthetic reports ------------------------------------------------------------------------
class Outcomes:
    """Builds synthetic groups: random binary rewards, fixed-size token ids and log-probs.

    Rewards: each problem gets a success rate p ~ U(0, 1) per report, then G Bernoulli(p) draws,
    so all-correct, all-wrong and mixed groups all occur (about 2/3 mixed at G = 8).
    """

    def __init__(self, params: ServiceParams, seed: int):
        self.p = params
        self.rng = np.random.default_rng(seed)
        toks = list(range(1000, 1000 + params.tokens))
        lps = [-0.5] * params.tokens
        self.completion = {r: pb.Completion(reward=r, token_ids=toks, logprobs=lps) for r in (0.0, 1.0)}
        self.prompt_ids = list(range(200, 200 + params.prompt_tokens))
        # in-process payload: a mixed TrajectoryGroup of the same shape, serialized once
        mixed = [self.completion[float(k % 2)] for k in range(params.group_size)]
        self.payload = pb.TrajectoryGroup(
            problem_id="bench-0000000", prompt_token_ids=self.prompt_ids, completions=mixed, reported_unix_s=time.time()
        ).SerializeToString()

    def rewards(self, n: int) -> np.ndarray:
        """(n, G) float rewards in {0, 1}."""
        p = self.rng.random(n)[:, None]
        return (self.rng.random((n, self.p.group_size)) < p).astype(float)

    def proto(self, ids: list[str]) -> list[pb.ProblemOutcome]:
        rw = self.rewards(len(ids))
        return [
            pb.ProblemOutcome(
                problem_id=pid, policy_version=0, prompt_token_ids=self.prompt_ids, completions=[self.completion[r] for r in row]
            )
            for pid, row in zip(ids, rw.tolist(), strict=True)
        ]

    def store(self, ids: list[str]) -> list[GroupOutcome]:
        rw = self.rewards(len(ids))
        out = []
        for pid, row in zip(ids, rw.tolist(), strict=True):
            mixed = 0.0 < sum(row) < len(row)
            out.append(GroupOutcome(pid, tuple(row), self.payload if mixed else b""))
        return out


def _bytes_field(number: int, value: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(value)) + value


class RawReports(Outcomes):
    """The same synthetic reports as :class:`Outcomes`, built as request bytes by concatenation.

    Each group's outcome is ``problem_id`` + the pre-serialized prompt ids and completions of its
    reward pattern (2^G patterns, built once), so the benchmark client spends microseconds, not
    milliseconds, per report and leaves the shared cores to the server. The bytes are exactly
    what ``pb.ReportOutcomesRequest(...).SerializeToString()`` gives (checked at construction).
    """

    def __init__(self, params: ServiceParams, seed: int):
        super().__init__(params, seed)
        if params.group_size > 12:
            raise ValueError(f"group_size ({params.group_size}) > 12: too many reward patterns to pre-serialize")
        g = params.group_size
        self.weights = 1 << np.arange(g)
        self.suffix = [
            pb.ProblemOutcome(
                prompt_token_ids=self.prompt_ids, completions=[self.completion[float(bits >> j & 1)] for j in range(g)]
            ).SerializeToString()
            for bits in range(1 << g)
        ]
        ids = ["bench-0000001", "bench-0000002"]
        rng_state = self.rng.bit_generator.state
        raw = self.request("L", ids, "w")
        self.rng.bit_generator.state = rng_state
        assert raw == pb.ReportOutcomesRequest(lease_id="L", outcomes=self.proto(ids), worker_id="w").SerializeToString()

    def request(self, lease_id: str, ids: list[str], worker_id: str = "bench") -> bytes:
        """Serialized ``ReportOutcomesRequest`` of one report of ``ids``."""
        bits = (self.rewards(len(ids)) @ self.weights).astype(int).tolist()
        parts = [_bytes_field(1, lease_id.encode())]
        for pid, b in zip(ids, bits, strict=True):
            parts.append(_bytes_field(2, _bytes_field(1, pid.encode()) + self.suffix[b]))
        parts.append(_bytes_field(3, worker_id.encode()))
        return b"".join(parts)


# -- the load loop ----------------------------------------------------------------------------
@dataclass
class LoadResult:
    """Counts and latencies (seconds) of the measured window of one load run."""

    sampled: int = 0
    reported: int = 0
    window_s: float = 0.0
    sample_lat: list[float] = field(default_factory=list)
    report_lat: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        s = np.asarray(self.sample_lat) * 1e3
        r = np.asarray(self.report_lat) * 1e3
        pct = lambda a, q: float(np.percentile(a, q)) if a.size else float("nan")  # noqa: E731
        return {
            "sampled_per_s": self.sampled / self.window_s if self.window_s else 0.0,
            "reported_per_s": self.reported / self.window_s if self.window_s else 0.0,
            "sample_p50_ms": pct(s, 50),
            "sample_p99_ms": pct(s, 99),
            "report_p50_ms": pct(r, 50),
            "report_p99_ms": pct(r, 99),
            "rpcs": int(s.size + r.size),
        }


SampleFn = Callable[[], Awaitable[tuple[str, list[str]]]]
ReportFn = Callable[[str, list[str]], Awaitable[None]]


async def load(clients: int, fns: list[tuple[SampleFn, ReportFn]], duration_s: float, warmup_s: float) -> LoadResult:
    """Run ``clients`` concurrent sample→report loops; measure the window after ``warmup_s``.

    Loop ``i`` uses ``fns[i % len(fns)]`` (e.g. one pair per connection).

    A call counts (rate and latency) when it started inside the window ``[warmup_s, warmup_s +
    duration_s)``; every loop finishes its current pair before stopping. A loop that has counted
    no sample by the window's end (a loaded machine whose first calls outlast a short window)
    runs one more pair, counted, and the window stretches to that pair's end: a rate is never 0
    for want of time, and every counted call lies inside its window.
    """
    res = LoadResult()
    t0 = time.perf_counter()
    start, stop = t0 + warmup_s, t0 + warmup_s + duration_s
    end = stop

    async def one(sample: SampleFn, report: ReportFn) -> None:
        nonlocal end
        counted = False
        while True:
            a = time.perf_counter()
            extra = a >= stop
            if extra and counted:
                return
            lease_id, ids = await sample()
            b = time.perf_counter()
            if not ids:
                if extra:
                    return  # nothing to lease after the window: a true 0, not a wait without end
                await asyncio.sleep(0.01)
                continue
            c = time.perf_counter()
            await report(lease_id, ids)
            d = time.perf_counter()
            if a >= start:
                res.sample_lat.append(b - a)
                res.sampled += len(ids)
                counted = True
            if c >= start and (c < stop or extra):
                res.report_lat.append(d - c)
                res.reported += len(ids)
            if extra:
                end = max(end, d)

    await asyncio.gather(*(one(*fns[i % len(fns)]) for i in range(clients)))
    res.window_s = max(1e-9, end - start)
    return res


def grpc_fns(ch: Any, params: ServiceParams, seed: int) -> tuple[SampleFn, ReportFn]:
    """Sample/report callables over the gRPC channel ``ch``; reports are sent as bytes built by
    :class:`RawReports` (the same messages a worker sends, at a fraction of the client's CPU)."""
    gen = RawReports(params, seed)
    stub = pb_grpc.PriorityServiceStub(ch)
    report_raw = ch.unary_unary(
        "/prioreplay.v1.PriorityService/ReportOutcomes",
        request_serializer=None,
        response_deserializer=pb.ReportOutcomesResponse.FromString,
    )

    async def sample() -> tuple[str, list[str]]:
        r = await stub.SampleProblems(
            pb.SampleProblemsRequest(batch_size=params.batch_size, worker_id="bench", accepts_group_size=True)
        )
        return r.lease_id, [lp.problem.id for lp in r.problems]

    async def report(lease_id: str, ids: list[str]) -> None:
        r = await report_raw(gen.request(lease_id, ids))
        if not r.accepted:
            raise RuntimeError(f"report refused: {r.reason}")

    return sample, report


def store_fns(store: Store, params: ServiceParams, seed: int) -> tuple[SampleFn, ReportFn]:
    """Sample/report callables on a store in-process (the ceiling)."""
    gen = Outcomes(params, seed)

    async def sample() -> tuple[str, list[str]]:
        lease = await store.sample(params.batch_size)
        return lease.lease_id, [sp.problem.id for sp in lease.problems]

    async def report(lease_id: str, ids: list[str]) -> None:
        r = await store.report(lease_id, gen.store(ids))
        if not r.accepted:
            raise RuntimeError(f"report refused: {r.reason}")

    return sample, report


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
