"""The service benchmark's workload: its parameters, the problems and synthetic reports it sends,
and the closed load loop that drives SampleProblems -> ReportOutcomes (over gRPC or a store
called in-process). Part 1 (:mod:`benchmarks.service`) and the other service parts use it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prioreplay.priority_server.store import Store
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
