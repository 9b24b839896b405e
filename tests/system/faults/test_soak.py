"""Soak: 64 concurrent asyncio clients against a ``prioreplay server`` process, with random kills.

Each client loops lease → "generate" (a short sleep) → report. A killer cancels random clients
while they "generate", so their leases are abandoned and must expire; a consumer pulls and
acknowledges the queued groups, like a learner. Runs ``--soak-seconds`` (default 15 s) per store.
At the end: no RPC error other than the injected cancellations, the server's RSS grew by less
than a generous bound after warm-up, and conservation holds (every accepted outcome counted
once, every queued group acknowledged exactly once, every problem in exactly one place).
"""

from __future__ import annotations

import asyncio
import random
import signal
import time

import grpc
import pytest

from prioreplay.priority_server.config import ServerConfig  # noqa: F401 - documents the flags used
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import ServerProcess
from tests.system.faults.test_process_kills import G, check_conservation, redis_dump, wait_for

CLIENTS = 64
PROBLEMS = 2000
BATCH = 4
LEASE_S = 1.0
#: Allowed RSS growth of the server between the end of warm-up and the end of the run, MiB.
RSS_GROWTH_LIMIT_MB = 64


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


class Tally:
    def __init__(self) -> None:
        self.completions = self.groups = self.queued = self.reports = self.kills = self.acked = 0
        self.errors: list[str] = []


async def client_loop(stub, rng: random.Random, tally: Tally, state: dict) -> None:
    while True:
        lease = await stub.SampleProblems(
            pb.SampleProblemsRequest(batch_size=BATCH, lease_timeout_s=LEASE_S, worker_id="soak"), timeout=30
        )
        if not lease.problems:
            await asyncio.sleep(min(lease.retry_after_s, 0.1))
            continue
        await asyncio.sleep(rng.uniform(0.0, 0.05))  # "generation": the killer strikes here
        outs = [
            pb.ProblemOutcome(
                problem_id=lp.problem.id,
                prompt_token_ids=[1, 2],
                completions=[
                    pb.Completion(reward=float(rng.random() < 0.5), token_ids=[3, 4, 5], logprobs=[-0.1, -0.2, -0.3])
                    for _ in range(G)
                ],
            )
            for lp in lease.problems
        ]
        state["reporting"] = True  # not cancelled from here on: the count stays exact
        rep = await stub.ReportOutcomes(pb.ReportOutcomesRequest(lease_id=lease.lease_id, outcomes=outs), timeout=30)
        state["reporting"] = False
        if rep.accepted:
            tally.reports += 1
            tally.completions += G * len(outs)
            tally.groups += len(outs)
            tally.queued += rep.groups_queued
        elif rep.reason != "expired":  # a slow client may outlive its 1 s lease under load
            tally.errors.append(f"report refused: {rep.reason}")


async def guarded(coro_fn, tally: Tally):
    try:
        await coro_fn()
    except asyncio.CancelledError:
        raise
    except grpc.aio.AioRpcError as e:
        tally.errors.append(f"{e.code().name}: {e.details()}")
    except Exception as e:  # noqa: BLE001
        tally.errors.append(repr(e))


async def consumer(stub, tally: Tally, stop: asyncio.Event) -> None:
    while not stop.is_set() or tally.acked < tally.queued:
        resp = await stub.PullTrajectories(pb.PullTrajectoriesRequest(max_groups=64, wait_s=0.1, consumer="soak"), timeout=30)
        if resp.groups:
            ack = await stub.AckTrajectories(pb.AckTrajectoriesRequest(group_ids=[g.group_id for g in resp.groups]), timeout=30)
            tally.acked += ack.acked
        elif stop.is_set():
            await asyncio.sleep(0.05)


async def soak(address: str, pid: int, seconds: float, seed: int) -> tuple[Tally, float, float]:
    rng = random.Random(seed)
    tally = Tally()
    async with grpc.aio.insecure_channel(address) as ch:
        stub = pb_grpc.PriorityServiceStub(ch)
        await stub.RegisterProblems(
            iter(
                [
                    pb.RegisterProblemsRequest(
                        problems=[pb.Problem(id=f"s{i}", prompt=f"{i} * 3 = ?", answer=str(3 * i)) for i in range(PROBLEMS)]
                    )
                ]
            ),
            timeout=60,
        )
        states: list[dict] = [{} for _ in range(CLIENTS)]
        tasks: list[asyncio.Task] = []
        for i in range(CLIENTS):
            r = random.Random(seed * 1000 + i)
            tasks.append(asyncio.create_task(guarded(lambda r=r, s=states[i]: client_loop(stub, r, tally, s), tally)))
        stop = asyncio.Event()
        cons = asyncio.create_task(guarded(lambda: consumer(stub, tally, stop), tally))
        t0 = time.monotonic()
        warm = min(3.0, seconds / 4)
        rss_warm = None
        while (elapsed := time.monotonic() - t0) < seconds:
            await asyncio.sleep(rng.uniform(0.05, 0.3))
            if rss_warm is None and elapsed >= warm:
                rss_warm = rss_mb(pid)
            i = rng.randrange(CLIENTS)
            if not states[i].get("reporting"):  # kill a "generating" client: its lease is abandoned
                tasks[i].cancel()
                tally.kills += 1
                states[i] = {}
                r = random.Random(seed * 1000 + CLIENTS + tally.kills)
                tasks[i] = asyncio.create_task(guarded(lambda r=r, s=states[i]: client_loop(stub, r, tally, s), tally))
        rss_end = rss_mb(pid)
        while not all(t.done() for t in tasks):  # the end: cancel each client outside its report
            for t, st in zip(tasks, states, strict=True):
                if not st.get("reporting"):
                    t.cancel()
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks, return_exceptions=True)
        stop.set()
        await asyncio.wait_for(cons, 60)
    return tally, rss_warm or rss_end, rss_end


@pytest.mark.soak
@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_soak_64_clients_with_random_kills(kind, redis_url, namespace, soak_seconds, tmp_path):
    pytest.importorskip("pytest_timeout")
    snap = tmp_path / "soak.json"
    store_args = (
        ["--snapshot-path", str(snap), "--snapshot-interval-s", "5"]
        if kind == "memory"
        else ["--store", redis_url, "--namespace", namespace]
    )
    srv = ServerProcess(*store_args, "--decay", "1", "--reaper-interval-s", "0.2", "--stats-interval-s", "1")
    try:
        srv.start()
        tally, rss_warm, rss_end = asyncio.run(
            asyncio.wait_for(soak(srv.address, srv.pid(), soak_seconds, seed=21), soak_seconds + 120)
        )
        print(
            f"\nsoak[{kind}] {soak_seconds:.0f}s: {tally.reports} reports, {tally.kills} kills, "
            f"{tally.acked} groups acked; server RSS {rss_warm:.1f} -> {rss_end:.1f} MiB "
            f"(+{rss_end - rss_warm:.1f})"
        )
        assert tally.errors == [], tally.errors[:5]
        assert tally.reports > 50 and tally.kills > 10
        assert rss_end - rss_warm < RSS_GROWTH_LIMIT_MB
        assert srv.proc.poll() is None
        # the abandoned leases expire; the server then holds exactly what was reported
        import grpc as _grpc

        with _grpc.insecure_channel(srv.address) as ch:
            stub = pb_grpc.PriorityServiceStub(ch)
            wait_for(lambda: stub.GetStats(pb.GetStatsRequest(), timeout=10).leased == 0, 30, "leases to expire")
            s = stub.GetStats(pb.GetStatsRequest(), timeout=10)
        assert s.lease_expiries >= 1
        assert (s.groups_acked, s.pending_groups, s.queue_depth) == (tally.queued, 0, 0)
        assert tally.acked == tally.queued
        if kind == "memory":
            assert srv.kill(signal.SIGTERM) == 0  # writes the snapshot
            from tests.system.faults.test_process_kills import _load_snapshot

            dump = _load_snapshot(snap)
        else:
            dump = redis_dump(redis_url, namespace)
        check_conservation(dump, completions=tally.completions, groups=tally.groups)
        assert dump["leases"] == []
    finally:
        srv.kill()
