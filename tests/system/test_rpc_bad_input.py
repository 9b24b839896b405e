"""Every RPC with empty, zero, negative, huge, NaN and mismatched arguments.

Each refused request must answer the status code the proto documents, with a message, and leave
the store exactly as it was (``store.dump()`` before == after), on both stores.
"""

from __future__ import annotations

import math
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from prioreplay.errors import NotFound
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.memory_store import MemoryStore
from prioreplay.priority_server.open_store import create_store
from prioreplay.priority_server.background_server import BackgroundServer
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import free_port

MAX_BATCH = 64
INVALID = grpc.StatusCode.INVALID_ARGUMENT
FAILED = grpc.StatusCode.FAILED_PRECONDITION
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
NAN, INF = math.nan, math.inf


def server_config() -> ServerConfig:
    # a 1 MiB message limit and small batch / lease limits make "huge" cheap to send
    return ServerConfig(metrics_port=0, max_message_mb=1, max_batch_size=MAX_BATCH, lease_timeout_s=600,
                        max_lease_timeout_s=3600, reaper_interval_s=0.5, stats_interval_s=0.5, snapshot_interval_s=0)


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(server.address) as ch:
        yield pb_grpc.PriorityServiceStub(ch)


def _problem(i, **kw) -> pb.Problem:
    return pb.Problem(**{"id": f"p{i}", "prompt": f"{i} + {i} = ?", "answer": str(2 * i), **kw})


def _group(rewards=(1.0, 0.0), **kw) -> list[pb.Completion]:
    return [pb.Completion(reward=r, token_ids=[7, 8], logprobs=[-0.5, -1.0], **kw) for r in rewards]


def _seed_state(stub) -> tuple[pb.SampleProblemsResponse, list[str]]:
    """20 problems, one reported lease (a queued group), one live lease, a published policy."""
    stub.RegisterProblems(iter([pb.RegisterProblemsRequest(problems=[_problem(i) for i in range(20)])]), timeout=10)
    first = stub.SampleProblems(pb.SampleProblemsRequest(batch_size=3), timeout=10)
    outs = [pb.ProblemOutcome(problem_id=lp.problem.id, completions=_group()) for lp in first.problems]
    assert stub.ReportOutcomes(pb.ReportOutcomesRequest(lease_id=first.lease_id, outcomes=outs), timeout=10).accepted
    stub.PublishPolicy(pb.PublishPolicyRequest(version=2, weights_uri="ckpt/step-2"), timeout=10)
    live = stub.SampleProblems(pb.SampleProblemsRequest(batch_size=4), timeout=10)
    leased = [lp.problem.id for lp in live.problems]
    return live, leased


def _cases(live: pb.SampleProblemsResponse, leased: list[str], other: str):
    """(name, RPC name, request or list of stream chunks, expected code)."""
    lid = live.lease_id

    def report(*outcomes, lease_id=lid, worker_id=""):
        return pb.ReportOutcomesRequest(lease_id=lease_id, outcomes=list(outcomes), worker_id=worker_id)

    def outcome(pid=leased[0], completions=None, **kw):
        return pb.ProblemOutcome(problem_id=pid, completions=_group() if completions is None else completions, **kw)

    def reg(*problems):
        return [pb.RegisterProblemsRequest(problems=list(problems))]

    good = outcome(leased[1])
    return [
        # RegisterProblems: a bad problem refuses its chunk
        ("register empty id", "RegisterProblems", reg(_problem(100, id="")), INVALID),
        ("register empty prompt", "RegisterProblems", reg(_problem(100, prompt="")), INVALID),
        ("register blank prompt", "RegisterProblems", reg(_problem(100, prompt="  \n")), INVALID),
        ("register empty answer", "RegisterProblems", reg(_problem(100, answer="")), INVALID),
        ("register unknown verifier", "RegisterProblems", reg(_problem(100, verifier="python")), INVALID),
        ("register 300-byte id", "RegisterProblems", reg(_problem(100, id="x" * 300)), INVALID),
        ("register control char id", "RegisterProblems", reg(_problem(100, id="a\nb")), INVALID),
        ("register good then bad in one chunk", "RegisterProblems", reg(_problem(100), _problem(101, answer="")),
         INVALID),
        ("register 2 MiB prompt", "RegisterProblems", reg(_problem(100, prompt="x" * (2 << 20))), EXHAUSTED),
        # SampleProblems
        ("sample batch 0", "SampleProblems", pb.SampleProblemsRequest(batch_size=0), INVALID),
        ("sample batch > max", "SampleProblems", pb.SampleProblemsRequest(batch_size=MAX_BATCH + 1), INVALID),
        ("sample batch 2^32-1", "SampleProblems", pb.SampleProblemsRequest(batch_size=2**32 - 1), INVALID),
        ("sample negative lease", "SampleProblems", pb.SampleProblemsRequest(batch_size=1, lease_timeout_s=-1),
         INVALID),
        ("sample NaN lease", "SampleProblems", pb.SampleProblemsRequest(batch_size=1, lease_timeout_s=NAN), INVALID),
        ("sample inf lease", "SampleProblems", pb.SampleProblemsRequest(batch_size=1, lease_timeout_s=INF), INVALID),
        ("sample lease > max", "SampleProblems", pb.SampleProblemsRequest(batch_size=1, lease_timeout_s=3601),
         INVALID),
        ("sample huge worker id", "SampleProblems", pb.SampleProblemsRequest(batch_size=1, worker_id="w" * 129),
         INVALID),
        # ReportOutcomes: the whole report is refused
        ("report empty lease id", "ReportOutcomes", report(good, lease_id=""), INVALID),
        ("report empty group", "ReportOutcomes", report(good, outcome(completions=[])), INVALID),
        ("report NaN reward", "ReportOutcomes", report(good, outcome(completions=_group((1.0, NAN)))), INVALID),
        ("report inf reward", "ReportOutcomes", report(good, outcome(completions=_group((INF, 0.0)))), INVALID),
        ("report reward 1.5", "ReportOutcomes", report(good, outcome(completions=_group((1.5, 0.0)))), INVALID),
        ("report reward -0.5", "ReportOutcomes", report(good, outcome(completions=_group((-0.5,)))), INVALID),
        ("report logprobs/token_ids mismatch", "ReportOutcomes",
         report(good, outcome(completions=[pb.Completion(reward=1.0, token_ids=[1, 2, 3], logprobs=[-1.0])])),
         INVALID),
        ("report logprobs without tokens", "ReportOutcomes",
         report(good, outcome(completions=[pb.Completion(reward=1.0, logprobs=[-1.0])])), INVALID),
        ("report NaN logprob", "ReportOutcomes",
         report(good, outcome(completions=[pb.Completion(reward=1.0, token_ids=[1], logprobs=[NAN])])), INVALID),
        ("report positive logprob", "ReportOutcomes",
         report(good, outcome(completions=[pb.Completion(reward=1.0, token_ids=[1], logprobs=[3.0])])), INVALID),
        ("report negative policy version", "ReportOutcomes", report(good, outcome(policy_version=-1)), INVALID),
        ("report NaN sampling temperature", "ReportOutcomes", report(good, outcome(sampling_temperature=float("nan"))), INVALID),
        ("report negative sampling temperature", "ReportOutcomes", report(good, outcome(sampling_temperature=-0.5)), INVALID),
        ("report NaN sampling top-p", "ReportOutcomes", report(good, outcome(sampling_top_p=float("nan"))), INVALID),
        ("report sampling top-p 1.5", "ReportOutcomes", report(good, outcome(sampling_top_p=1.5)), INVALID),
        ("report problem not in lease", "ReportOutcomes", report(good, outcome(other)), INVALID),
        ("report unknown problem", "ReportOutcomes", report(good, outcome("no-such-problem")), INVALID),
        ("report problem twice", "ReportOutcomes", report(outcome(), outcome()), INVALID),
        ("report empty problem id", "ReportOutcomes", report(good, outcome("")), INVALID),
        ("report huge worker id", "ReportOutcomes", report(good, worker_id="w" * 500), INVALID),
        ("report 2 MiB of tokens", "ReportOutcomes",
         report(outcome(completions=[pb.Completion(reward=1.0, token_ids=[1] * (1 << 20), logprobs=[-1.0] * (1 << 20))])),
         EXHAUSTED),
        # PullTrajectories
        ("pull 0 groups", "PullTrajectories", pb.PullTrajectoriesRequest(max_groups=0), INVALID),
        ("pull > max groups", "PullTrajectories", pb.PullTrajectoriesRequest(max_groups=MAX_BATCH + 1), INVALID),
        ("pull 2^32-1 groups", "PullTrajectories", pb.PullTrajectoriesRequest(max_groups=2**32 - 1), INVALID),
        ("pull negative wait", "PullTrajectories", pb.PullTrajectoriesRequest(max_groups=1, wait_s=-1), INVALID),
        ("pull NaN wait", "PullTrajectories", pb.PullTrajectoriesRequest(max_groups=1, wait_s=NAN), INVALID),
        ("pull inf wait", "PullTrajectories", pb.PullTrajectoriesRequest(max_groups=1, wait_s=INF), INVALID),
        ("pull wait 61 s", "PullTrajectories", pb.PullTrajectoriesRequest(max_groups=1, wait_s=61), INVALID),
        ("pull huge consumer", "PullTrajectories", pb.PullTrajectoriesRequest(max_groups=1, consumer="c" * 129),
         INVALID),
        # PublishPolicy
        ("publish version 0", "PublishPolicy", pb.PublishPolicyRequest(version=0, weights_uri="x"), INVALID),
        ("publish version -1", "PublishPolicy", pb.PublishPolicyRequest(version=-1, weights_uri="x"), INVALID),
        ("publish version -2^63", "PublishPolicy", pb.PublishPolicyRequest(version=-(2**63), weights_uri="x"),
         INVALID),
        ("publish empty uri", "PublishPolicy", pb.PublishPolicyRequest(version=3, weights_uri=""), INVALID),
        ("publish 5000-byte uri", "PublishPolicy", pb.PublishPolicyRequest(version=3, weights_uri="u" * 5000),
         INVALID),
        ("publish older version", "PublishPolicy", pb.PublishPolicyRequest(version=1, weights_uri="ckpt/step-1"),
         FAILED),
        ("publish same version, other uri", "PublishPolicy",
         pb.PublishPolicyRequest(version=2, weights_uri="ckpt/other"), FAILED),
        # GetStats
        ("stats 1001 buckets", "GetStats", pb.GetStatsRequest(histogram_buckets=1001), INVALID),
        ("stats 2^32-1 buckets", "GetStats", pb.GetStatsRequest(histogram_buckets=2**32 - 1), INVALID),
    ]


def _call(stub, method: str, request):
    fn = getattr(stub, method)
    if method == "RegisterProblems":
        return fn(iter(request), timeout=10)
    return fn(request, timeout=10)


def test_bad_requests_are_refused_and_change_nothing(server, stub):
    live, leased = _seed_state(stub)
    other = next(f"p{i}" for i in range(20) if f"p{i}" not in leased)
    cases = _cases(live, leased, other)
    assert len({name for name, *_ in cases}) == len(cases)
    wrong = []
    for name, method, request, code in cases:
        before = server.call(server.store.dump())
        try:
            _call(stub, method, request)
            wrong.append(f"{name}: accepted, expected {code.name}")
            continue
        except grpc.RpcError as e:
            if e.code() != code or not e.details():
                wrong.append(f"{name}: {e.code().name} {e.details()!r}, expected {code.name}")
        if server.call(server.store.dump()) != before:
            wrong.append(f"{name}: the store changed")
    assert not wrong, "\n".join(wrong)
    # the live lease is still reportable after all those refusals
    outs = [pb.ProblemOutcome(problem_id=pid, completions=_group()) for pid in leased]
    assert stub.ReportOutcomes(pb.ReportOutcomesRequest(lease_id=live.lease_id, outcomes=outs), timeout=10).accepted


def test_accepted_oddities_change_only_what_they_should(server, stub):
    """Requests the proto answers without an error: no-ops, counted unknowns, idempotent repeats."""
    live, leased = _seed_state(stub)
    before = server.call(server.store.dump())

    # empty stream, empty chunk: nothing registered, total reported
    resp = stub.RegisterProblems(iter([pb.RegisterProblemsRequest()]), timeout=10)
    assert (resp.created, resp.updated, resp.total) == (0, 0, 20)
    # unknown / empty / many garbage ids: counted as unknown
    garbage = ["", "0-0", "not-an-id"] + [f"{i}-{i}" for i in range(5000)]
    ack = stub.AckTrajectories(pb.AckTrajectoriesRequest(group_ids=garbage), timeout=10)
    assert (ack.acked, ack.unknown) == (0, len(garbage))
    assert stub.AckTrajectories(pb.AckTrajectoriesRequest(), timeout=10).acked == 0
    # the same policy again: idempotent
    pub = stub.PublishPolicy(pb.PublishPolicyRequest(version=2, weights_uri="ckpt/step-2"), timeout=10)
    assert (pub.version, pub.weights_uri) == (2, "ckpt/step-2")
    # 0 buckets means 10
    assert len(stub.GetStats(pb.GetStatsRequest(), timeout=10).priority_histogram) == 10
    assert server.call(server.store.dump()) == before

    # an unknown lease: accepted = false, only late_reports moves
    rep = stub.ReportOutcomes(pb.ReportOutcomesRequest(
        lease_id="f" * 32, outcomes=[pb.ProblemOutcome(problem_id=leased[0], completions=_group())]), timeout=10)
    assert (rep.accepted, rep.reason) == (False, "unknown lease")
    after = server.call(server.store.dump())
    assert after["counters"]["late_reports"] == before["counters"]["late_reports"] + 1
    after["counters"]["late_reports"] -= 1
    assert after == before


def test_a_bad_chunk_keeps_the_chunks_before_it(server, stub):
    chunks = [pb.RegisterProblemsRequest(problems=[_problem(i) for i in range(5)]),
              pb.RegisterProblemsRequest(problems=[_problem(5), _problem(6, prompt="")])]
    with pytest.raises(grpc.RpcError) as e:
        stub.RegisterProblems(iter(chunks), timeout=10)
    assert e.value.code() == INVALID
    assert "problem #6" in e.value.details()  # the index in the whole stream
    assert set(server.call(server.store.dump())["problems"]) == {f"p{i}" for i in range(5)}


def test_unreachable_redis_answers_unavailable(redis_url, namespace):
    cfg = server_config()
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with BackgroundServer(lambda: create_store(dead, cfg.to_store_config(), namespace=namespace), cfg) as s, \
            grpc.insecure_channel(s.address) as ch:
        stub = pb_grpc.PriorityServiceStub(ch)
        for method, req in (("SampleProblems", pb.SampleProblemsRequest(batch_size=1)),
                            ("GetStats", pb.GetStatsRequest())):
            with pytest.raises(grpc.RpcError) as e:
                getattr(stub, method)(req, timeout=20)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, method
            assert "unreachable" in e.value.details()
        status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING


class _FaultyStore(MemoryStore):
    """A memory store whose sample fails on purpose (to check the servicer's error mapping)."""

    error: Exception = NotFound("problem 'x' vanished")

    async def _sample(self, batch_size, lease_timeout_s, request_id=""):
        raise self.error


@pytest.mark.parametrize("error,code", [(NotFound("problem 'x' vanished"), grpc.StatusCode.NOT_FOUND),
                                        (RuntimeError("secret internals"), grpc.StatusCode.INTERNAL)])
def test_domain_errors_map_to_status_codes(error, code):
    cfg = server_config()
    store_cls = type("Faulty", (_FaultyStore,), {"error": error})
    with BackgroundServer(lambda: store_cls(cfg.to_store_config()), cfg) as s, grpc.insecure_channel(s.address) as ch:
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.PriorityServiceStub(ch).SampleProblems(pb.SampleProblemsRequest(batch_size=1), timeout=10)
        assert e.value.code() == code
        if code == grpc.StatusCode.NOT_FOUND:
            assert e.value.details() == "problem 'x' vanished"
        else:
            assert "secret internals" not in e.value.details()
        # the interceptor records after the status went out: give it a moment
        line = f'prioreplay_rpc_errors_total{{code="{code.name}",method="SampleProblems"}} 1.0'
        deadline = time.monotonic() + 5
        while line not in s.runtime.metrics.render().decode() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert line in s.runtime.metrics.render().decode()


def test_vectorised_logprob_check_agrees_with_the_scan():
    """The servicer's one-pass check over packed bytes flags exactly the reports the scan refuses."""
    import random

    from prioreplay.errors import InvalidArgument
    from prioreplay.priority_server.servicer import validate_outcome
    from prioreplay.priority_server.wire import logprobs_all_valid

    rng = random.Random(3)
    for trial in range(60):
        outcomes = []
        for _ in range(rng.randint(1, 4)):
            comps = []
            for _ in range(rng.randint(1, 4)):
                n = rng.choice([0, 1, 5, 127, 128, 300])  # 128+ values: multi-byte length varints
                lps = [-rng.random() * 10 for _ in range(n)]
                if n and rng.random() < 0.3:
                    lps[rng.randrange(n)] = rng.choice([NAN, INF, -INF, 0.5, 1e-4])
                comps.append(pb.Completion(reward=rng.random(), token_ids=[rng.randrange(1 << 20)] * n, logprobs=lps,
                                           text="t" * rng.randint(0, 200), truncated=rng.random() < 0.5))
            outcomes.append(pb.ProblemOutcome(problem_id="p", policy_version=rng.randint(0, 5),
                                              prompt_token_ids=[1] * rng.randint(0, 200), completions=comps))
        try:
            for i, o in enumerate(outcomes):
                validate_outcome(o, i)
            scan_ok = True
        except InvalidArgument:
            scan_ok = False
        assert logprobs_all_valid(outcomes) == scan_ok, trial
