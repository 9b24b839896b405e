"""Acknowledged reports lost in a Redis failover, counted as Jepsen counts: what the server said
it had, looked up afterwards.

A primary, two replicas and three sentinels (:class:`benchmarks.sentinel_cluster.SentinelCluster`);
a priority server (``BackgroundServer``, the real gRPC service) on ``redis+sentinel://`` with
``--min-replica-acks`` as given; ``clients`` threads lease and report at full rate, each report
sent again while the server answers UNAVAILABLE or the call times out, as a worker does. ONE fault
happens once ``warmup_acks`` reports are acknowledged:

``kill``
    SIGKILL of the primary.
``failover``
    a planned ``SENTINEL FAILOVER``.
``pause``
    the primary SIGSTOPped past the sentinels' down-after time until a replica is promoted, then
    SIGCONT: it comes back believing it is the primary, until the sentinels demote it; writes it
    accepts meanwhile are discarded by the demotion, so none of them may have been acknowledged.
``replica-restart``
    a replica SIGKILLed and restarted empty on its port; as soon as the sentinels list it as up
    again, while it may still be syncing, the primary is SIGKILLed (the failover may pick either
    replica: an acknowledged report must be on whichever it picks).

The run ends by itself once the fault is over (the new primary serves and is followed by both
replicas) and ``after_acks`` more reports are acknowledged, or after ``bound_s`` seconds. Then every
acknowledged report is looked up on the primary the sentinels name: its lease among the reported
ones (``tomb:reported``) and each of its groups in the trajectory stream (each group carries the
report's number in its token ids). A report is acknowledged when the server answered ``accepted``,
or ``already reported`` to a resend after an error (the worker then knows it is done).

Figures per run: acknowledged, found, lost, duplicated (groups in the stream more than once) and the
time without service: the longest gap between two acknowledgements. ``main`` writes, per fault and
setting, ``failover.lost.<fault>.<setting>`` (the most lost in a run; ``min`` and every run's count
beside it) and the medians ``....acknowledged`` and ``....no_service_s`` to ``benchmarks/results.json``.

    python -m benchmarks.failover_loss --runs 3                       # every fault and setting
    python -m benchmarks.failover_loss --fault pause --min-replica-acks 1 --runs 1
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

import grpc

from benchmarks.sentinel_cluster import SentinelCluster, until

FAULTS = ("kill", "failover", "pause", "replica-restart")
SETTINGS = ("all", "1", "0")
NAMESPACE = "loss"
PROBLEMS = 200
BATCH = 4
GROUP = 4
#: Seconds a client waits for one answer (a paused primary holds requests until it resumes).
RPC_TIMEOUT_S = 2.0


@dataclass
class LossResult:
    """One run's count (see the module docstring); times in seconds."""

    fault: str
    setting: str
    acknowledged: int
    found: int
    lost: int
    duplicated: int
    no_service_s: float
    errors: int
    elapsed_s: float
    promoted: str


class Clients:
    """``n`` threads that lease and report at full rate; records each acknowledged report."""

    def __init__(self, address: str, n: int):
        from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc

        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.PriorityServiceStub(self.channel)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: list[tuple[float, int, str, tuple[str, ...]]] = []  # (time, report number, lease, problems)
        self.errors: Counter[str] = Counter()
        self._serial = 0
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]

    def start(self) -> Clients:
        for t in self.threads:
            t.start()
        return self

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(RPC_TIMEOUT_S * 3)
        self.channel.close()

    def acked_since(self, t: float) -> int:
        with self.lock:
            return sum(1 for when, *_ in self.acked if when > t)

    def _next_serial(self) -> int:
        with self.lock:
            self._serial += 1
            return self._serial

    def _run(self, i: int) -> None:
        from prioreplay.v1 import priority_service_pb2 as pb

        while not self.stop.is_set():
            try:
                lease = self.stub.SampleProblems(
                    pb.SampleProblemsRequest(batch_size=BATCH, worker_id=f"w{i}"), timeout=RPC_TIMEOUT_S
                )
            except grpc.RpcError as e:
                self.errors[e.code().name] += 1
                time.sleep(0.02)
                continue
            if not lease.problems:
                time.sleep(0.02)
                continue
            serial = self._next_serial()
            req = pb.ReportOutcomesRequest(
                lease_id=lease.lease_id,
                worker_id=f"w{i}",
                outcomes=[
                    pb.ProblemOutcome(
                        problem_id=lp.problem.id,
                        # mixed rewards: every group is queued; its token ids carry the report's number
                        completions=[
                            pb.Completion(reward=float(j % 2), token_ids=[serial, j], logprobs=[-0.1, -0.2]) for j in range(GROUP)
                        ],
                    )
                    for lp in lease.problems
                ],
            )
            if self._report(req):
                with self.lock:
                    self.acked.append((time.monotonic(), serial, lease.lease_id, tuple(lp.problem.id for lp in lease.problems)))

    def _report(self, req) -> bool:
        """Send ``req`` until answered (resent after UNAVAILABLE or a timeout); True when acknowledged."""
        resent = False
        while not self.stop.is_set():
            try:
                answer = self.stub.ReportOutcomes(req, timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as e:
                self.errors[e.code().name] += 1
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    return False
                resent = True
                time.sleep(0.02)
                continue
            return answer.accepted or (resent and answer.reason == "already reported")
        return False


def _server(cluster: SentinelCluster, setting: str):
    from prioreplay.priority_server.background_server import BackgroundServer
    from prioreplay.priority_server.config import ServerConfig
    from prioreplay.priority_server.open_store import create_store

    # max_queue_depth 0: no learner drains the queue here. Leases of 10 s: a lease whose report went to
    # the old primary (unknown there) holds its problems until it expires; 200 problems must not run out
    config = ServerConfig(
        store=cluster.url,
        namespace=NAMESPACE,
        metrics_port=0,
        stats_interval_s=0.5,
        max_queue_depth=0,
        lease_timeout_s=10.0,
        min_replica_acks=setting,
    )
    url = cluster.url
    return BackgroundServer(
        lambda: create_store(url, config.to_store_config(), namespace=NAMESPACE, replication=config.replication()), config
    )


def _register(stub) -> None:
    from prioreplay.v1 import priority_service_pb2 as pb

    problems = [pb.Problem(id=f"p{i:03d}", prompt=f"{i}+1", answer=str(i + 1)) for i in range(PROBLEMS)]
    request = pb.RegisterProblemsRequest(problems=problems)
    until("the problems registered", lambda: _try(lambda: stub.RegisterProblems(iter([request]), timeout=10)))


def _try(call) -> bool:
    try:
        call()
        return True
    except grpc.RpcError:
        return False


def _fault(cluster: SentinelCluster, fault: str, bound_s: float) -> str:
    """Cause ``fault`` and return the name of the primary the sentinels promoted ("" for none)."""
    old = cluster.current_primary()
    switched = lambda: cluster.switched_from(old)  # noqa: E731
    if fault == "kill":
        cluster.kill(old)
        return until("a replica promoted after the kill", switched, bound_s)
    if fault == "failover":
        cluster.planned_failover()
        return until("the planned failover ended", switched, bound_s)
    if fault == "pause":
        cluster.pause(old)
        try:
            return until("a replica promoted while the primary is paused", switched, bound_s)
        finally:
            cluster.resume(old)
    if fault == "replica-restart":
        replica = next(n for n in cluster.redis_names if n != old)
        cluster.kill(replica)
        until(f"the sentinels see {replica} down", lambda: replica not in cluster.promotable_replicas(), bound_s)
        cluster.start_redis(replica)  # empty: nothing is persisted
        until(f"the sentinels see {replica} up again", lambda: replica in cluster.promotable_replicas(), bound_s)
        cluster.kill(old)
        return until("a replica promoted after the kill", switched, bound_s)
    raise ValueError(f"fault ({fault!r}) must be one of {', '.join(FAULTS)}")


def _recovered(cluster: SentinelCluster, promoted: str) -> bool:
    """The promoted primary is followed by every live replica, the old primary demoted if alive."""
    live = [n for n in cluster.redis_names if n != promoted and cluster.procs[n].poll() is None]
    return all(cluster.role(n) == "slave" for n in live) and cluster.acknowledging(promoted, len(live), 200) >= len(live)


def _look_up(cluster: SentinelCluster, acked: list) -> tuple[int, int]:
    """(found, duplicated) of the acknowledged reports on the primary the sentinels name."""
    from prioreplay.priority_server.store.redis.keys import redis_key
    from prioreplay.v1 import priority_service_pb2 as pb

    r = cluster.client(cluster.current_primary(), socket_timeout=30)
    pipe = r.pipeline(transaction=False)
    for _, _, lease, _ in acked:
        pipe.zscore(redis_key(NAMESPACE, "tomb:reported"), lease)
    reported = pipe.execute()
    groups: Counter[tuple[int, str]] = Counter()
    for _, fields in cast(list[tuple[bytes, dict[bytes, bytes]]], r.xrange(redis_key(NAMESPACE, "stream"))):
        g = pb.TrajectoryGroup.FromString(fields[b"p"])
        groups[(g.completions[0].token_ids[0], g.problem_id)] += 1
    found = sum(
        1
        for (_, serial, _, problems), score in zip(acked, reported, strict=True)
        if score is not None and all(groups[(serial, p)] for p in problems)
    )
    return found, sum(1 for n in groups.values() if n > 1)


def _load_and_fault(
    cluster: SentinelCluster, fault: str, load: Clients, warmup_acks: int, after_acks: int, bound_s: float
) -> str:
    """Register, start the clients, wait for ``warmup_acks``, cause ``fault``, wait for the recovery and
    ``after_acks`` more; returns the promoted primary's name."""
    _register(load.stub)
    cluster.wait_replicated()  # the problems are on every replica before any fault
    load.start()
    until("reports acknowledged before the fault", lambda: len(load.acked) >= warmup_acks, bound_s)
    promoted = _fault(cluster, fault, bound_s)
    until(f"{promoted} followed by the replicas", lambda: _recovered(cluster, promoted), bound_s)
    t_recovered = time.monotonic()
    until("reports acknowledged after the recovery", lambda: load.acked_since(t_recovered) >= after_acks, bound_s)
    return promoted


def run_fault(
    fault: str,
    setting: str = "all",
    workdir: Path | None = None,
    clients: int = 3,
    warmup_acks: int = 30,
    after_acks: int = 30,
    bound_s: float = 30.0,
) -> LossResult:
    """One run: cluster, server, clients, ``fault``, then the count (see the module docstring).

    Args:
        fault: one of :data:`FAULTS`.
        setting: ``--min-replica-acks`` (``all`` or a number).
        workdir: a folder for the Redis processes (default: a temporary one, removed after).
        clients: client threads.
        warmup_acks / after_acks: acknowledged reports before the fault / after the recovery.
        bound_s: seconds each phase (warm-up, fault, recovery) may take.

    Raises:
        ValueError: an unknown fault.
        TimeoutError: a phase did not end within ``bound_s`` (the message names it).
    """
    if fault not in FAULTS:
        raise ValueError(f"fault ({fault!r}) must be one of {', '.join(FAULTS)}")
    with tempfile.TemporaryDirectory(prefix="failover-loss-") as tmp:
        cluster = SentinelCluster(Path(workdir or tmp))
        try:  # every process is stopped whatever happens (a phase past its bound, an interrupt)
            cluster.start()
            t0 = time.monotonic()
            with _server(cluster, setting) as srv:
                load = Clients(srv.address, clients)
                try:
                    promoted = _load_and_fault(cluster, fault, load, warmup_acks, after_acks, bound_s)
                finally:
                    load.close()
            elapsed = time.monotonic() - t0
            found, duplicated = _look_up(cluster, load.acked)
        finally:
            cluster.stop()
    times = sorted(t for t, *_ in load.acked)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return LossResult(
        fault=fault,
        setting=setting,
        acknowledged=len(load.acked),
        found=found,
        lost=len(load.acked) - found,
        duplicated=duplicated,
        no_service_s=round(max(gaps, default=0.0), 3),
        errors=sum(load.errors.values()),
        elapsed_s=round(elapsed, 2),
        promoted=promoted,
    )


def main(argv: list[str] | None = None) -> int:
    """Run each fault and setting ``--runs`` times; print one line per run and write the figures."""
    from benchmarks.results import RESULTS, Results, log, merge_results

    ap = argparse.ArgumentParser(prog="python -m benchmarks.failover_loss", description=__doc__.split("\n\n")[0])
    ap.add_argument("--fault", choices=FAULTS, action="append", help="a fault (repeatable; default: every fault)")
    ap.add_argument("--min-replica-acks", dest="settings", choices=SETTINGS, action="append", help="default: all, 1, 0")
    ap.add_argument("--runs", type=int, default=3, help="runs of each fault and setting")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--warmup-acks", type=int, default=200, help="reports acknowledged before the fault")
    ap.add_argument("--no-write", action="store_true", help="print only; leave benchmarks/results.json as it is")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the server's warnings while the fault lasts are expected
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the Redis processes are stopped too
    if a.runs < 1:
        ap.error(f"--runs ({a.runs}) must be >= 1")
    command = "python -m benchmarks.failover_loss " + " ".join(sys.argv[1:] if argv is None else argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results = Results(command, note=f"load average at start {load} (1, 5, 15 min); real redis-server/sentinel on loopback")
    for fault in a.fault or FAULTS:
        for setting in a.settings or SETTINGS:
            runs, failed = [], []
            for i in range(a.runs):
                try:
                    r = run_fault(fault, setting, clients=a.clients, warmup_acks=a.warmup_acks)
                except TimeoutError as e:  # a phase past its bound: kept as a failed run, the others go on
                    failed.append(str(e))
                    log(f"{fault} --min-replica-acks {setting} run {i + 1} failed: {e}")
                    continue
                runs.append(r)
                log(f"{fault} --min-replica-acks {setting} run {i + 1}: {asdict(r)}")
            if not runs:
                continue
            lost = [r.lost for r in runs]
            key = f"failover.lost.{fault}.{setting}"
            per_run = dict(runs=len(runs), per_run=[asdict(r) for r in runs], failed_runs=failed)
            results.add(key, max(lost), "reports", min=min(lost), **per_run)
            results.add(f"{key}.acknowledged", statistics.median(r.acknowledged for r in runs), "reports")
            results.add(f"{key}.no_service_s", statistics.median(r.no_service_s for r in runs), "s")
            print(
                f"{fault:16s} {setting:>4s}  lost {min(lost)}-{max(lost)} of ~{runs[0].acknowledged}; "
                f"duplicated {max(r.duplicated for r in runs)}; without service (median) "
                f"{statistics.median(r.no_service_s for r in runs):.2f} s",
                flush=True,
            )
    if not a.no_write:
        merge_results(RESULTS, results.items)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
