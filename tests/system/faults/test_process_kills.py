"""Faults with real processes: what survives a SIGKILL of a worker, the server or Redis (the
learner: test_learner_killed.py).

Every test ends with the conservation check: every outcome the server accepted is counted
exactly once in the statistics (Σ n over problems == completions_reported == completions of the
accepted reports; groups_* == groups of the accepted reports), every problem is in exactly one
place, and every queued (mixed) group reaches the learner at least once and is acknowledged at
most once. Workers are small client loops in subprocesses reporting synthetic outcomes (the
real ``prioreplay worker`` is exercised in tests/system/worker/test_worker.py).
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.priority_server.background_server import BackgroundServer
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.open_store import create_store
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.memory_store import MemoryStore
from prioreplay.rules import Pool
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import REPO, ServerProcess, free_port, start_redis_server

# real processes killed and restarted: minutes; make test-fast leaves them out
pytestmark = pytest.mark.slow

G = 4  # completions per group

# A synthetic rollout worker: lease, "generate" seeded rewards, report. Modes:
#   hold  – lease one batch, print it, then sleep (until SIGKILL);
#   late  – lease one batch, print it, wait for a line on stdin, then report it and print the answer;
#   loop  – lease and report N batches, printing one JSON line per report.
WORKER = r"""
import json, random, sys, time
from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.v1 import priority_service_pb2 as pb
address, mode, batch, lease_s, n, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
rng = random.Random(seed)
client = PriorityClient(ClientSettings(server=address, rpc_timeout_s=10), max_retries=20, backoff_s=0.05)

def outcomes(lease):
    out = []
    for lp in lease.problems:
        rewards = [float(rng.random() < 0.5) for _ in range(%(G)d)]
        comps = [pb.Completion(reward=r, token_ids=[5, 6, 7], logprobs=[-0.5, -0.7, -0.9]) for r in rewards]
        out.append(pb.ProblemOutcome(problem_id=lp.problem.id, completions=comps, prompt_token_ids=[8, 9]))
    return out

def say(**kw):
    print(json.dumps(kw), flush=True)

done = 0
while done < n:
    lease = client.sample(batch, worker_id=f"w{seed}", lease_timeout_s=lease_s)
    if not lease.problems:
        time.sleep(min(lease.retry_after_s, 0.2))
        continue
    ids = [lp.problem.id for lp in lease.problems]
    if mode == "hold":
        say(lease=lease.lease_id, ids=ids)
        time.sleep(3600)
    if mode == "late":
        say(lease=lease.lease_id, ids=ids)
        sys.stdin.readline()
    outs = outcomes(lease)
    r = client.report(lease.lease_id, outs, worker_id=f"w{seed}")
    say(lease=lease.lease_id, ids=ids, accepted=r.accepted, reason=r.reason, completions=%(G)d * len(outs),
        groups=len(outs), queued=r.groups_queued)
    done += 1
""" % {"G": G}


class Worker:
    """A synthetic worker subprocess; :meth:`line` reads its next JSON line."""

    def __init__(self, address: str, mode: str, batch: int, lease_s: float, n: int = 1, seed: int = 0):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, address, mode, str(batch), str(lease_s), str(n), str(seed)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )

    def line(self, timeout_s: float = 60.0) -> dict:
        box: list[str] = []
        t = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout_s)
        assert box and box[0], f"worker said nothing within {timeout_s}s (exit {self.proc.poll()})"
        return json.loads(box[0])

    def lines(self, timeout_s: float = 60.0) -> list[dict]:
        out, _ = self.proc.communicate(timeout=timeout_s)
        assert self.proc.returncode == 0, out
        return [json.loads(x) for x in out.splitlines()]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def wait_for(pred, timeout_s: float, what: str, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval_s)


def problems(n: int, prefix: str = "p") -> list[pb.Problem]:
    return [pb.Problem(id=f"{prefix}{i}", prompt=f"{i} + 1 = ?", answer=str(i + 1)) for i in range(n)]


def synthetic_outcomes(lease, rng: random.Random, mixed: bool = False) -> list[pb.ProblemOutcome]:
    out = []
    for lp in lease.problems:
        rewards = (
            [1.0, 0.0] + [float(rng.random() < 0.5) for _ in range(G - 2)]
            if mixed
            else [float(rng.random() < 0.5) for _ in range(G)]
        )
        comps = [pb.Completion(reward=r, token_ids=[5, 6, 7], logprobs=[-0.5, -0.7, -0.9]) for r in rewards]
        out.append(pb.ProblemOutcome(problem_id=lp.problem.id, completions=comps, prompt_token_ids=[8, 9]))
    return out


def check_conservation(dump: dict, completions: int | None = None, groups: int | None = None) -> None:
    """Σ n == completions_reported (== ``completions``), groups counters (== ``groups``), one place each."""
    c = dump["counters"]
    n_sum = sum(v[1] for v in dump["problems"].values())
    assert n_sum == c["completions_reported"], (n_sum, c)
    kinds = c["groups_mixed"] + c["groups_all_correct"] + c["groups_all_wrong"] + c["groups_constant"]
    assert kinds * G == c["completions_reported"], c
    if completions is not None:
        assert c["completions_reported"] == completions, (c, completions)
    if groups is not None:
        assert kinds == groups, (c, groups)
    leased = [pid for lease in dump["leases"] for pid in lease]
    assert len(leased) == len(set(leased))  # a problem is in at most one lease
    in_leased_pool = sorted(pid for pid, v in dump["problems"].items() if v[0] == int(Pool.LEASED))
    assert in_leased_pool == sorted(leased)  # ... and leased exactly when it is in a lease
    assert all(
        v[0] in (int(Pool.HEAP), int(Pool.SOLVED), int(Pool.UNSOLVED), int(Pool.LEASED)) for v in dump["problems"].values()
    )


def redis_dump(url: str, namespace: str) -> dict:
    async def go():
        store = create_store(url, StoreConfig(), namespace=namespace)
        try:
            return await store.dump()
        finally:
            await store.close()

    return asyncio.run(go())


def _background(kind: str, redis_url: str, namespace: str, **kw) -> BackgroundServer:
    kw.setdefault("decay", 1.0)  # cumulative counts: check_conservation counts completions exactly
    cfg = ServerConfig(metrics_port=0, snapshot_interval_s=0, reaper_interval_s=0.1, stats_interval_s=0.2, **kw)
    spec = "memory" if kind == "memory" else redis_url
    return BackgroundServer(lambda: create_store(spec, cfg.to_store_config(), namespace=namespace), cfg)


# -- a worker killed while holding a lease ----------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_worker_killed_holding_a_lease(kind, redis_url, namespace):
    with (
        _background(kind, redis_url, namespace) as srv,
        PriorityClient(ClientSettings(server=srv.address), max_retries=2) as client,
    ):
        client.register(problems(12))
        rng = random.Random(1)
        first = client.sample(12)  # give every problem some statistics first
        assert client.report(first.lease_id, synthetic_outcomes(first, rng)).accepted
        before = srv.call(srv.store.dump())
        doomed = Worker(srv.address, "hold", batch=4, lease_s=1.0, seed=2)
        try:
            held = doomed.line()
            assert srv.call(srv.store.stats()).leased == 4
        finally:
            doomed.kill()  # SIGKILL while holding the lease
        assert doomed.proc.returncode == -signal.SIGKILL
        wait_for(lambda: srv.call(srv.store.stats()).leased == 0, 20, "the lease to expire")
        after = srv.call(srv.store.dump())
        for pid in held["ids"]:  # back where they were, statistics unchanged
            assert after["problems"][pid] == before["problems"][pid], pid
        assert after["counters"]["lease_expiries"] == before["counters"]["lease_expiries"] + 1
        assert after["counters"]["completions_reported"] == before["counters"]["completions_reported"]
        # another worker carries on and gets the returned problems again
        survivor = Worker(srv.address, "loop", batch=4, lease_s=30, n=3, seed=3)
        try:
            reports = survivor.lines()
        finally:
            survivor.kill()
        assert all(r["accepted"] for r in reports) and len(reports) == 3
        assert set(held["ids"]) <= {pid for r in reports for pid in r["ids"]}
        final = srv.call(srv.store.dump())
        check_conservation(final, completions=G * (12 + 12), groups=12 + 12)
        assert final["leases"] == []


# -- a report after the lease expired and was leased again ---------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_late_report_is_refused_and_the_new_holder_counts(kind, redis_url, namespace):
    with (
        _background(kind, redis_url, namespace) as srv,
        PriorityClient(ClientSettings(server=srv.address), max_retries=2) as client,
    ):
        client.register(problems(3))
        slow = Worker(srv.address, "late", batch=3, lease_s=0.5, seed=4)
        try:
            old = slow.line()
            wait_for(lambda: srv.call(srv.store.stats()).lease_expiries == 1, 20, "the lease to expire")
            new = client.sample(3, lease_timeout_s=60)
            assert sorted(lp.problem.id for lp in new.problems) == sorted(old["ids"])  # leased again
            slow.proc.stdin.write("report now\n")
            slow.proc.stdin.flush()
            late = slow.line()
        finally:
            slow.kill()
        assert (late["accepted"], late["reason"]) == (False, "expired")
        mid = srv.call(srv.store.dump())
        assert mid["counters"]["completions_reported"] == 0 and mid["counters"]["late_reports"] == 1
        rep = client.report(new.lease_id, synthetic_outcomes(new, random.Random(5), mixed=True))
        assert rep.accepted and rep.groups_queued == 3
        again = client.report(new.lease_id, synthetic_outcomes(new, random.Random(6), mixed=True))
        assert (again.accepted, again.reason) == (False, "already reported")  # a duplicate changes nothing
        final = srv.call(srv.store.dump())
        check_conservation(final, completions=3 * G, groups=3)
        assert final["counters"]["late_reports"] == 2 and len(final["queue"]) == 3


# -- the priority server killed mid-run -------------------------------------------------------
class ReportLoop(threading.Thread):
    """Leases and reports batches through a retrying client until stopped; counts what was applied.

    A report counts when it was accepted, or answered "already reported" (the server applied an
    earlier attempt whose answer was lost in the crash; each lease is reported once here).
    """

    def __init__(self, address: str, batch: int = 4, lease_s: float = 3.0, seed: int = 0, lossy: bool = False):
        super().__init__(daemon=True)
        self.client = PriorityClient(ClientSettings(server=address, rpc_timeout_s=5), max_retries=40, backoff_s=0.05)
        self.batch, self.lease_s, self.rng = batch, lease_s, random.Random(seed)
        # the memory store forgets leases made after its last snapshot: "unknown lease" is then expected
        self.refusals = ("expired", "unknown lease") if lossy else ("expired",)
        self.stop_flag = threading.Event()
        self.reports = self.completions = self.groups = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop_flag.is_set():
                lease = self.client.sample(self.batch, lease_timeout_s=self.lease_s)
                if not lease.problems:
                    time.sleep(0.05)
                    continue
                outs = synthetic_outcomes(lease, self.rng, mixed=self.rng.random() < 0.5)
                r = self.client.report(lease.lease_id, outs)
                if r.accepted or r.reason == "already reported":
                    self.reports += 1
                    self.completions += G * len(outs)
                    self.groups += len(outs)
                else:
                    assert r.reason in self.refusals, r.reason  # only a lease that outlived the outage
        except BaseException as e:  # noqa: BLE001 - reported by finish()
            self.error = e
        finally:
            self.client.close()

    def wait_reports(self, n: int, timeout_s: float = 60) -> None:
        wait_for(lambda: self.reports >= n or self.error, timeout_s, f"{n} reports")
        assert self.error is None, self.error

    def finish(self) -> None:
        self.stop_flag.set()
        self.join(60)
        assert not self.is_alive()
        assert self.error is None, repr(self.error)


@pytest.mark.timeout(180)
def test_server_killed_with_redis_loses_nothing(redis_url, namespace):
    srv = ServerProcess("--decay", "1", "--store", redis_url, "--namespace", namespace, "--reaper-interval-s", "0.2")
    loop = None
    try:
        srv.start()
        with PriorityClient(ClientSettings(server=srv.address), max_retries=5) as c:
            c.register(problems(40))
        loop = ReportLoop(srv.address, seed=7)
        loop.start()
        for round_ in range(2):
            loop.wait_reports(5 + 10 * round_)
            assert srv.kill() == -signal.SIGKILL  # mid-run: RPCs in flight
            srv.start()
        loop.wait_reports(30)
        loop.finish()
        with PriorityClient(ClientSettings(server=srv.address), max_retries=5) as c:
            # leases orphaned by the crash (leased, answer lost) expire and come back unchanged
            wait_for(lambda: c.stats().leased == 0, 30, "orphaned leases to expire")
    finally:
        if loop is not None:
            loop.stop_flag.set()
        srv.kill()
    check_conservation(redis_dump(redis_url, namespace), completions=loop.completions, groups=loop.groups)


def _stats_tuple(address: str) -> tuple:
    with PriorityClient(ClientSettings(server=address), max_retries=10, backoff_s=0.05) as c:
        s = c.stats()
    return (
        s.problems,
        s.step,
        s.completions_reported,
        s.groups_mixed,
        s.groups_all_correct,
        s.groups_all_wrong,
        s.queue_depth,
        s.reward_sum,
    )


def _load_snapshot(path: Path) -> dict:
    async def go():
        store = MemoryStore(StoreConfig(), path)
        return await store.dump()  # no close(): that would write the file

    return asyncio.run(go())


@pytest.mark.timeout(180)
def test_server_killed_with_memory_loses_only_what_followed_the_last_snapshot(tmp_path):
    snap = tmp_path / "state.json"
    srv = ServerProcess(
        "--decay", "1", "--snapshot-path", str(snap), "--snapshot-interval-s", "3600", "--reaper-interval-s", "0.2"
    )
    try:
        srv.start()
        with PriorityClient(ClientSettings(server=srv.address), max_retries=5) as c:
            c.register(problems(30))
        loop = ReportLoop(srv.address, seed=8)
        loop.start()
        loop.wait_reports(6)
        loop.finish()
        # a clean stop (SIGTERM) writes the snapshot: nothing is lost
        clean = _stats_tuple(srv.address)
        assert srv.kill(signal.SIGTERM) == 0
        srv.start()
        assert _stats_tuple(srv.address) == clean
        assert clean[2] == loop.completions
        # more work, then SIGKILL: exactly the state of the last snapshot comes back (the loss bound)
        loop2 = ReportLoop(srv.address, seed=9)
        loop2.start()
        loop2.wait_reports(5)
        loop2.finish()
        assert _stats_tuple(srv.address)[2] == loop.completions + loop2.completions
        assert srv.kill() == -signal.SIGKILL
        srv.start()
        assert _stats_tuple(srv.address) == clean
        assert srv.kill(signal.SIGTERM) == 0
        check_conservation(_load_snapshot(snap), completions=loop.completions, groups=loop.groups)

        # frequent snapshots and repeated SIGKILLs under load: every restart loads a whole snapshot
        srv.args = ["--decay", "1", "--snapshot-path", str(snap), "--snapshot-interval-s", "0.05", "--reaper-interval-s", "0.2"]
        srv.start()
        loop3 = ReportLoop(srv.address, seed=10, lossy=True)
        loop3.start()
        rng = random.Random(11)
        for _ in range(2):
            time.sleep(0.3 + rng.random() * 0.7)
            assert srv.kill() == -signal.SIGKILL
            srv.start()  # raises if the snapshot were refused as corrupt
            check_conservation(_load_snapshot(snap))
        loop3.finish()
    finally:
        srv.kill()
    assert "corrupt" not in srv.log
    check_conservation(_load_snapshot(snap))


SNAPSHOTTER = r"""
import asyncio, sys
from pathlib import Path
from prioreplay.priority_server.store.memory_store import MemoryStore
from prioreplay.priority_server.store import StoreConfig
from prioreplay.problems import ProblemRecord

async def main():
    store = MemoryStore(StoreConfig(), Path(sys.argv[1]))
    await store.register([ProblemRecord(id=f"p{i}", prompt="x" * 400, answer="1") for i in range(20000)])
    await store.snapshot()
    print("first", flush=True)
    i = 0
    while True:  # keep changing the state and rewriting the snapshot until killed
        await store.register([ProblemRecord(id=f"extra{i}", prompt="y", answer="1")])
        await store.snapshot()
        i += 1

asyncio.run(main())
"""


@pytest.mark.timeout(180)
def test_a_crash_while_writing_the_snapshot_leaves_the_previous_one_loadable(tmp_path):
    snap = tmp_path / "state.json"
    rng = random.Random(14)
    caught_mid_write = 0
    for _ in range(4):  # SIGKILL at seeded random moments of a loop that rewrites a ~10 MB snapshot
        proc = subprocess.Popen([sys.executable, "-c", SNAPSHOTTER, str(snap)], stdout=subprocess.PIPE, text=True, cwd=REPO)
        try:
            assert proc.stdout.readline().strip() == "first"
            time.sleep(rng.uniform(0.05, 0.6))
            caught_mid_write += any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
            proc.kill()
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        dump = _load_snapshot(snap)  # the last complete snapshot: loads, whole
        ids = set(dump["problems"])
        assert {f"p{i}" for i in range(20000)} <= ids
        extras = sorted(int(pid[5:]) for pid in ids if pid.startswith("extra"))
        assert extras == list(range(len(extras)))  # a prefix of the writes, nothing torn
    assert caught_mid_write, "no kill landed during a write"


# -- Redis restarted ---------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_redis_restart_keeps_everything_and_the_server_reconnects(tmp_path, namespace):
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    redis_proc = start_redis_server(port, str(tmp_path), appendonly=True)
    srv = ServerProcess(
        "--decay", "1", "--store", url, "--namespace", namespace, "--reaper-interval-s", "0.2", "--stats-interval-s", "0.2"
    )
    try:
        srv.start()
        rng = random.Random(12)
        with PriorityClient(ClientSettings(server=srv.address, rpc_timeout_s=5), max_retries=0) as c:
            c.register(problems(10))
            first = c.sample(4)
            assert c.report(first.lease_id, synthetic_outcomes(first, rng, mixed=True)).groups_queued == 4
            pulled = c.pull(2, consumer="L")  # 2 pending (delivered, unacknowledged), 2 never delivered
            assert len(pulled.groups) == 2
            live = c.sample(3, lease_timeout_s=120)  # a live lease across the outage
            before = redis_dump(url, namespace)
            stats_before = c.stats()

            redis_proc.kill()
            redis_proc.wait(10)
            with grpc.insecure_channel(srv.address) as ch:  # while Redis is down: UNAVAILABLE, no crash
                stub = pb_grpc.PriorityServiceStub(ch)
                for call in (
                    lambda: stub.GetStats(pb.GetStatsRequest(), timeout=10),
                    lambda: stub.SampleProblems(pb.SampleProblemsRequest(batch_size=1), timeout=10),
                ):
                    with pytest.raises(grpc.RpcError) as e:
                        call()
                    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            assert srv.proc.poll() is None

            # a retrying client waits it out with backoff
            box: dict = {}
            retrying = PriorityClient(ClientSettings(server=srv.address, rpc_timeout_s=5), max_retries=30, backoff_s=0.1)
            t = threading.Thread(target=lambda: box.setdefault("stats", retrying.stats()), daemon=True)
            t.start()
            time.sleep(1.0)
            assert t.is_alive()  # still retrying
            redis_proc = start_redis_server(port, str(tmp_path), appendonly=True)
            t.join(60)
            retrying.close()
            assert "stats" in box and box["stats"].completions_reported == stats_before.completions_reported

            assert redis_dump(url, namespace) == before  # statistics, pools, leases, queue
            again = c.pull(4, consumer="L", include_own_pending=True)
            ids = [g.group_id for g in again.groups]
            assert ids[:2] == [g.group_id for g in pulled.groups]  # the pending ones first, redelivered
            assert [g.delivery_count for g in again.groups] == [2, 2, 1, 1]
            assert c.ack(ids).acked == 4 and c.ack(ids).acked == 0  # acknowledged once
            rep = c.report(live.lease_id, synthetic_outcomes(live, rng))
            assert rep.accepted  # the lease survived
            s = c.stats()
            assert (s.groups_acked, s.pending_groups, s.queue_depth, s.leased) == (4, 0, rep.groups_queued, 0)
            check_conservation(redis_dump(url, namespace), completions=G * 7, groups=7)
    finally:
        srv.kill()
        redis_proc.kill()
        redis_proc.wait(10)
    assert "Traceback" not in srv.log, srv.log
