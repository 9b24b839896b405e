"""The pipelined worker loop (``--pipeline``, the default) with a fake backend and a fake client.

No model and no server: the fake backend's ``generate`` blocks on events the test controls, and
the fake client records every lease and report in one ordered log, so each test checks an order
of events (which call happened while which other one was running), never a duration. A wait
(``WAIT_S``) only bounds a test that would otherwise hang if the order it checks were broken.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass, field

import pytest

from prioreplay.errors import StoreUnavailable
from prioreplay.rollout_worker.backends.base import GeneratedCompletion
from prioreplay.rollout_worker.config import WorkerConfig
from prioreplay.rollout_worker.main import stop_after_batch_on_signal
from prioreplay.rollout_worker.pipeline import PipelinedLoop
from prioreplay.rollout_worker.worker import RolloutWorker
from prioreplay.v1 import priority_service_pb2 as pb

B, G = 2, 3
#: Bound on a wait for an event another thread sets (a broken order fails instead of hanging).
WAIT_S = 20.0
FAR = 10**10  # a deadline (Unix seconds) no test reaches


class Log:
    """Events in the order they happened, from every thread."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self._lock = threading.Lock()

    def add(self, *event) -> None:
        with self._lock:
            self.events.append(event)

    def index(self, *event) -> int:
        return self.events.index(event)


class FakeTokenizer:
    chat_template = None

    def __call__(self, text: str) -> dict:
        return {"input_ids": [len(text) % 50 + 1, 2, 3]}


class FakeBackend:
    """Generates ``n`` fixed completions per prompt; ``hooks[k]`` (if given) runs inside the k-th
    ``generate`` call (1-based), so a test can block generation or act while it runs."""

    max_context_tokens = 0

    def __init__(self, log: Log, hooks: dict | None = None):
        self.log, self.hooks, self.calls = log, hooks or {}, 0
        self.policy_version = 0
        self.tokenizer = FakeTokenizer()
        self.generating = threading.Event()
        self.threads: set[str] = set()

    def generate(self, prompts, n, params):
        self.calls += 1
        k = self.calls
        self.threads.add(threading.current_thread().name)
        self.generating.set()
        self.log.add("generate-start", k, self.policy_version)
        if k in self.hooks:
            self.hooks[k]()
        self.log.add("generate-end", k)
        self.generating.clear()
        return [
            [GeneratedCompletion(token_ids=[7, 8], logprobs=[-0.5, -0.5], text=str(i % 2 * 4), truncated=False) for i in range(n)]
            for _ in prompts
        ]

    def load_weights(self, uri: str, version: int) -> float:
        assert not self.generating.is_set(), "weights loaded while a batch was generating"
        self.log.add("load", version)
        self.policy_version = version
        return 0.01


@dataclass
class FakeClient:
    """Answers leases from ``leases`` (then empty ones); records reports.

    ``on_sample[k]`` / ``on_report[lease_id]`` run inside the k-th sample call / that lease's report.
    """

    log: Log
    backend: FakeBackend
    leases: list[pb.SampleProblemsResponse]
    on_sample: dict = field(default_factory=dict)
    on_report: dict = field(default_factory=dict)
    reports: dict = field(default_factory=dict)
    samples: int = 0

    def sample(self, batch_size, worker_id="", lease_timeout_s=0.0, client_source=0, request_id=None, accepts_group_size=False):
        self.samples += 1
        k = self.samples
        self.log.add("sample", k, self.backend.generating.is_set())
        if k in self.on_sample:
            self.on_sample[k]()
        if self.leases:
            return self.leases.pop(0)
        return pb.SampleProblemsResponse(retry_after_s=0.5)

    def report_lease(self, lease_id, outcomes, worker_id="", client_source=0, rewards_only=False, unservable=(), observe=None):
        assert lease_id not in self.reports, f"lease {lease_id} reported twice"
        if lease_id in self.on_report:
            self.on_report[lease_id]()
        self.reports[lease_id] = list(outcomes)
        self.log.add("report", lease_id, len(outcomes))
        return pb.ReportOutcomesResponse(accepted=True, groups_queued=len(outcomes))


def lease(k: int, deadline: float = FAR, version: int = 0, uri: str = "") -> pb.SampleProblemsResponse:
    problems = [
        pb.LeasedProblem(problem=pb.Problem(id=f"l{k}-p{i}", prompt=f"What is {k} + {i}?", answer="4", verifier="exact"))
        for i in range(B)
    ]
    return pb.SampleProblemsResponse(
        lease_id=f"lease-{k}", problems=problems, lease_deadline_unix_s=deadline, policy_version=version, weights_uri=uri
    )


def make(log: Log, leases, hooks=None, **kw) -> tuple[RolloutWorker, FakeBackend, FakeClient]:
    backend = FakeBackend(log, hooks)
    client = FakeClient(log, backend, leases)
    cfg = WorkerConfig(group_size=G, batch_size=B, metrics_port=0, worker_id="w", max_retry_sleep_s=0.5, **kw)
    worker = RolloutWorker(cfg, backend, client, sleep=lambda s: None)  # type: ignore[arg-type]  # the fakes hold the methods the worker calls
    return worker, backend, client


def waiter(event: threading.Event, log: Log, name: str):
    """A hook that waits for ``event`` and logs whether it came."""
    return lambda: log.add(name, event.wait(WAIT_S))


def test_pipeline_is_the_default_and_no_pipeline_parses():
    from prioreplay.apps.cli import parse

    assert WorkerConfig(metrics_port=0).pipeline is True
    assert parse("worker", ["--no-pipeline"]).pipeline is False


def test_the_next_lease_is_asked_for_while_the_current_batch_generates():
    log, second_lease = Log(), threading.Event()
    w, backend, client = make(log, [lease(1), lease(2)], max_batches=2)
    backend.hooks[1] = waiter(second_lease, log, "second lease during generate 1")
    client.on_sample[2] = second_lease.set
    assert w.run() == 0
    assert ("second lease during generate 1", True) in log.events
    assert client.samples == 2  # none asked ahead of the last batch (max_batches)
    assert sorted(client.reports) == ["lease-1", "lease-2"] and all(len(o) == B for o in client.reports.values())
    assert backend.threads == {threading.current_thread().name}  # generation stays on the caller's thread


def test_verify_and_report_of_a_batch_overlap_the_next_generation():
    """Batch 1's report waits until generation 2 has begun, and generation 2 waits until that
    report has begun: both complete only if they run at the same time."""
    log, generating_2, reporting_1 = Log(), threading.Event(), threading.Event()
    w, backend, client = make(log, [lease(1), lease(2), lease(3)], max_batches=3)
    backend.hooks[2] = lambda: (generating_2.set(), log.add("generate 2 saw report 1", reporting_1.wait(WAIT_S)))
    client.on_report["lease-1"] = lambda: (reporting_1.set(), log.add("report 1 saw generate 2", generating_2.wait(WAIT_S)))
    assert w.run() == 0
    assert ("generate 2 saw report 1", True) in log.events and ("report 1 saw generate 2", True) in log.events
    assert [[c.reward for c in o.completions] for o in client.reports["lease-1"]] == [[0.0, 1.0, 0.0]] * B  # verified
    assert all(len(o.completions) == G for outs in client.reports.values() for o in outs)


def test_sequential_mode_leases_only_while_nothing_generates():
    log = Log()
    w, _backend, client = make(log, [lease(1), lease(2), lease(3)], max_batches=3, pipeline=False)
    assert w.run() == 0
    samples = [e for e in log.events if e[0] == "sample"]
    assert samples == [("sample", 1, False), ("sample", 2, False), ("sample", 3, False)]
    assert log.index("report", "lease-1", B) < log.index("generate-start", 2, 0)


def test_a_lease_held_ahead_that_would_expire_before_its_turn_is_released_not_generated():
    """Clock at 1000 s; every lease lasts 1 ns, so any generation outlasts it. The lease asked for
    ahead of batch 1 (no estimate yet) is handed back at its turn with an empty report; once a
    generation has been measured no lease is asked for ahead."""
    log = Log()
    leases = [lease(k, deadline=1000.0 + 1e-9) for k in range(1, 5)]
    w, _backend, client = make(log, leases, max_batches=3)
    loop = PipelinedLoop(w, clock=lambda: 1000.0)
    assert loop.run() == 0
    assert loop.released == 1 and client.reports["lease-2"] == []  # released: its problems return unchanged
    assert {k: len(v) for k, v in client.reports.items()} == {"lease-1": B, "lease-2": 0, "lease-3": B, "lease-4": B}
    samples = [e for e in log.events if e[0] == "sample"]
    assert [e[1] for e in samples] == [1, 2, 3, 4]
    assert samples[2:] == [("sample", 3, False), ("sample", 4, False)]  # asked only while nothing generated
    assert w.batches_done == 3 and len([e for e in log.events if e[0] == "generate-start"]) == 3


def test_a_newer_version_is_loaded_before_generating_its_lease_and_each_batch_keeps_its_version(tmp_path):
    log = Log()
    w, _backend, client = make(log, [lease(1), lease(2, version=1, uri=str(tmp_path / "v1"))], max_batches=2)
    assert w.run() == 0
    assert log.index("generate-end", 1) < log.index("load", 1) < log.index("generate-start", 2, 1)
    assert {o.policy_version for o in client.reports["lease-1"]} == {0}
    assert {o.policy_version for o in client.reports["lease-2"]} == {1}


def test_sigterm_mid_pipeline_reports_every_generated_batch_and_releases_the_lease_ahead():
    """SIGTERM while batch 2 generates, batch 1's report still in flight and lease 3 held ahead:
    batches 1 and 2 are reported whole, lease 3 is released unused, and the loop returns 0."""
    log, signalled = Log(), threading.Event()
    w, backend, client = make(log, [lease(1), lease(2), lease(3), lease(4)])

    def sigterm() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # handled on this (the main) thread before the next bytecode
        log.add("sigterm", w.stop_event.is_set())
        signalled.set()

    backend.hooks[2] = sigterm
    client.on_report["lease-1"] = lambda: signalled.wait(WAIT_S)  # batch 1's report is in flight at the signal
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    timers = stop_after_batch_on_signal(w, grace_s=WAIT_S)
    try:
        assert w.run() == 0
    finally:
        for t in timers:
            t.cancel()
        for s, h in old.items():
            signal.signal(s, h)
    assert ("sigterm", True) in log.events
    assert {k: len(v) for k, v in client.reports.items()} == {"lease-1": B, "lease-2": B, "lease-3": 0}
    assert all(len(o.completions) == G for k in ("lease-1", "lease-2") for o in client.reports[k])
    assert backend.calls == 2 and w.batches_done == 2 and client.samples == 3


def test_a_failed_lease_ahead_is_retried_and_the_batch_in_flight_is_still_reported():
    log = Log()
    w, _backend, client = make(log, [lease(1), lease(2)], max_batches=2)
    slept = []
    w._sleep = slept.append

    def outage() -> None:  # before the fake pops a lease: lease 2 is kept for the retry
        raise StoreUnavailable("SampleProblems: Redis is out of memory", kind="out_of_memory")

    client.on_sample[2] = outage
    assert w.run() == 0
    assert slept == [pytest.approx(0.5)]  # max_retry_sleep_s, once
    assert {k: len(v) for k, v in client.reports.items()} == {"lease-1": B, "lease-2": B}
