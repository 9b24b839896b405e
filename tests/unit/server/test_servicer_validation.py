"""The servicer's request validation in-process: every malformed request of tests/support/rpc_cases.py is
handed to :class:`PriorityServicer` over a memory store (no gRPC server, no Redis) and must end
with the status code the proto documents, a message, and the store unchanged.

Limits the gRPC transport enforces (message size: RESOURCE_EXHAUSTED) are left to
tests/system/server/test_rpc_bad_input.py, which sends the same cases over the wire to both stores.
"""

from __future__ import annotations

import math
import random

import grpc
import pytest

from prioreplay.errors import InvalidArgument
from prioreplay.priority_server.servicer import PriorityServicer
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.memory_store import MemoryStore
from prioreplay.priority_server.wire import logprobs_all_valid, validate_outcome
from prioreplay.v1 import priority_service_pb2 as pb
from tests.support.rpc_cases import EXHAUSTED, MAX_BATCH, MAX_LEASE_S, bad_request_cases, group, problem

NAN, INF = math.nan, math.inf


class Aborted(Exception):
    """What a fake context's ``abort`` raises: the status the RPC ended with."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details


class FakeContext:
    """The part of ``grpc.aio.ServicerContext`` the servicer uses: ``abort``."""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


async def _stream(chunks):
    for c in chunks:
        yield c


async def call(servicer: PriorityServicer, method: str, request):
    """One RPC on the servicer, as the gRPC server would make it (a stream for RegisterProblems);
    an answer the servicer gives serialized is decoded, as the client would."""
    arg = _stream(request) if method == "RegisterProblems" else request
    answer = await getattr(servicer, method)(arg, FakeContext())
    if isinstance(answer, bytes):
        output = pb.DESCRIPTOR.services_by_name["PriorityService"].methods_by_name[method].output_type
        return getattr(pb, output.name).FromString(answer)
    return answer


@pytest.fixture
async def servicer():
    store = MemoryStore(
        StoreConfig(max_batch_size=MAX_BATCH, lease_timeout_s=600, max_lease_timeout_s=MAX_LEASE_S), clock=lambda: 1_700_000_000.0
    )
    yield PriorityServicer(store, max_message_mb=1)
    await store.close()


async def _seed_state(servicer) -> tuple[pb.SampleProblemsResponse, list[str]]:
    """20 problems, one reported lease (a queued group), one live lease, a published policy."""
    await call(servicer, "RegisterProblems", [pb.RegisterProblemsRequest(problems=[problem(i) for i in range(20)])])
    first = await call(servicer, "SampleProblems", pb.SampleProblemsRequest(batch_size=3))
    outs = [pb.ProblemOutcome(problem_id=lp.problem.id, completions=group()) for lp in first.problems]
    assert (await call(servicer, "ReportOutcomes", pb.ReportOutcomesRequest(lease_id=first.lease_id, outcomes=outs))).accepted
    await call(servicer, "PublishPolicy", pb.PublishPolicyRequest(version=2, weights_uri="ckpt/step-2"))
    live = await call(servicer, "SampleProblems", pb.SampleProblemsRequest(batch_size=4))
    return live, [lp.problem.id for lp in live.problems]


async def test_bad_requests_are_refused_with_their_code_and_change_nothing(servicer):
    live, leased = await _seed_state(servicer)
    other = next(f"p{i}" for i in range(20) if f"p{i}" not in leased)
    cases = [c for c in bad_request_cases(live, leased, other) if c[3] != EXHAUSTED]  # transport limits: system
    assert len(cases) > 50
    wrong = []
    for name, method, request, code in cases:
        before = await servicer.store.dump()
        try:
            await call(servicer, method, request)
            wrong.append(f"{name}: accepted, expected {code.name}")
            continue
        except Aborted as e:
            if e.code != code or not e.details:
                wrong.append(f"{name}: {e.code.name} {e.details!r}, expected {code.name}")
        if await servicer.store.dump() != before:
            wrong.append(f"{name}: the store changed")
    assert not wrong, "\n".join(wrong)
    outs = [pb.ProblemOutcome(problem_id=pid, completions=group()) for pid in leased]
    assert (await call(servicer, "ReportOutcomes", pb.ReportOutcomesRequest(lease_id=live.lease_id, outcomes=outs))).accepted


async def test_a_bad_chunk_names_its_index_in_the_stream_and_keeps_the_chunks_before_it(servicer):
    chunks = [
        pb.RegisterProblemsRequest(problems=[problem(i) for i in range(5)]),
        pb.RegisterProblemsRequest(problems=[problem(5), problem(6, prompt="")]),
    ]
    with pytest.raises(Aborted) as e:
        await call(servicer, "RegisterProblems", chunks)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "problem #6" in e.value.details
    assert set((await servicer.store.dump())["problems"]) == {f"p{i}" for i in range(5)}


async def test_undecodable_report_bytes_answer_invalid_argument(servicer):
    with pytest.raises(Aborted) as e:
        await call(servicer, "ReportOutcomes", b"\xff\xff\xff")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_an_unexpected_error_answers_internal_without_its_message(servicer, monkeypatch):
    async def boom(*a, **kw):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(servicer.store, "stats", boom)
    with pytest.raises(Aborted) as e:
        await call(servicer, "GetStats", pb.GetStatsRequest())
    assert e.value.code == grpc.StatusCode.INTERNAL and "secret internals" not in e.value.details


def test_vectorised_logprob_check_agrees_with_the_scan():
    """The servicer's one-pass check over packed bytes flags exactly the reports the scan refuses."""
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
                comps.append(
                    pb.Completion(
                        reward=rng.random(),
                        token_ids=[rng.randrange(1 << 20)] * n,
                        logprobs=lps,
                        text="t" * rng.randint(0, 200),
                        truncated=rng.random() < 0.5,
                    )
                )
            outcomes.append(
                pb.ProblemOutcome(
                    problem_id="p",
                    policy_version=rng.randint(0, 5),
                    prompt_token_ids=[1] * rng.randint(0, 200),
                    completions=comps,
                )
            )
        try:
            for i, o in enumerate(outcomes):
                validate_outcome(o, i)
            scan_ok = True
        except InvalidArgument:
            scan_ok = False
        assert logprobs_all_valid(outcomes) == scan_ok, trial
