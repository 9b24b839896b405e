"""The lean ReportOutcomes path (``wire.lean_report``) agrees with the per-field path.

For canonical reports it must give the same groups (ids, rewards, and payload bytes identical to
rebuilding a ``TrajectoryGroup``) and refuse exactly what the per-field checks refuse; reports in
another valid encoding (unpacked or split packed fields) must fall back to the per-field checks,
so a bad value hidden in such an encoding is still refused over gRPC.
"""

from __future__ import annotations

import math
import random
import struct

import grpc
import pytest

from prioreplay.errors import InvalidArgument
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.servicer import checked_groups
from prioreplay.priority_server import wire
from prioreplay.priority_server.wire import lean_report
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import drop_namespace, start_background_server

NAN, INF = math.nan, math.inf


def _random_report(rng: random.Random, bad: bool) -> pb.ReportOutcomesRequest:
    outcomes = []
    for k in range(rng.randint(1, 5)):
        comps = []
        for _ in range(rng.randint(0 if bad else 1, 5)):
            n = rng.choice([0, 1, 5, 127, 128, 300])  # 128+: multi-byte length varints
            toks = [rng.choice([0, 1, 127, 128, 16383, 16384, (1 << 32) - 1]) for _ in range(n)]
            lps = [-rng.random() * 10 for _ in range(n)]
            if bad and rng.random() < 0.3:
                if n and rng.random() < 0.5:
                    lps[rng.randrange(n)] = rng.choice([NAN, INF, -INF, 0.5, 1e-4, 2e-3])
                else:
                    lps = lps + [-1.0] if rng.random() < 0.5 else lps[:-1]
            comps.append(pb.Completion(reward=rng.choice([0.0, 1.0, 0.5, rng.random()]), token_ids=toks, logprobs=lps,
                                       text="t" * rng.randint(0, 200), truncated=rng.random() < 0.5))
        version = rng.randint(0, 5) if not (bad and rng.random() < 0.1) else -1
        temp = rng.choice([0.0, 0.7, 1.0]) if not (bad and rng.random() < 0.1) else rng.choice([NAN, INF, -1.0])
        pid = f"p{k}" if not (bad and rng.random() < 0.05) else ""
        top_p = rng.choice([0.0, 0.9, 1.0]) if not (bad and rng.random() < 0.1) else rng.choice([NAN, 1.5, -0.1])
        outcomes.append(pb.ProblemOutcome(problem_id=pid, policy_version=version, sampling_temperature=temp,
                                          sampling_top_p=top_p,
                                          prompt_token_ids=[rng.randrange(1 << 17) for _ in range(rng.randint(0, 200))],
                                          completions=comps))
    return pb.ReportOutcomesRequest(lease_id="L", outcomes=outcomes, rewards_only=rng.random() < 0.2)


def _per_field(req: pb.ReportOutcomesRequest, now: float):
    """What the per-field path gives: [(id, rewards, payload)], or InvalidArgument."""
    return [(g.problem_id, g.rewards, g.payload) for g in checked_groups(req, now, not req.rewards_only)]


@pytest.mark.parametrize("bad", [False, True])
def test_lean_path_gives_the_per_field_result_byte_for_byte(bad, monkeypatch):
    monkeypatch.setattr(wire, "LEAN_MIN_BYTES", 0)  # small reports too
    rng = random.Random(11 + bad)
    lean_taken = refused = 0
    for trial in range(150):
        req = _random_report(rng, bad)
        raw = req.SerializeToString()
        try:
            expected = _per_field(req, 1234.5)
        except InvalidArgument:
            expected = None
        got = lean_report(raw, pb.ReportOutcomesRequest.FromString(raw), 1234.5, not req.rewards_only)
        if expected is None:
            refused += 1
            assert got is None, trial  # the lean path never accepts what the per-field checks refuse
        else:
            assert got == expected, trial
            lean_taken += 1
    assert lean_taken > 10 and (refused > 20 if bad else refused == 0), (lean_taken, refused)


def _tag(field: int, wire: int) -> bytes:
    return bytes([field << 3 | wire])


def _unpacked_completion(reward: float, tokens: list[int], logprobs: list[float]) -> bytes:
    """A Completion whose repeated fields use the unpacked encoding (valid protobuf, not canonical)."""
    out = _tag(1, 1) + struct.pack("<d", reward)
    for t in tokens:
        out += _tag(2, 0) + bytes([t])  # t < 128
    for lp in logprobs:
        out += _tag(3, 5) + struct.pack("<f", lp)
    return out


def _report_bytes(lease_id: str, pid: str, completions: list[bytes]) -> bytes:
    o = _tag(1, 2) + bytes([len(pid)]) + pid.encode()
    for c in completions:
        o += _tag(4, 2) + bytes([len(c)]) + c
    return _tag(1, 2) + bytes([len(lease_id)]) + lease_id.encode() + _tag(2, 2) + bytes([len(o)]) + o


def test_non_canonical_encodings_fall_back_to_the_per_field_checks(monkeypatch):
    monkeypatch.setattr(wire, "LEAN_MIN_BYTES", 0)
    good = [_unpacked_completion(1.0, [5, 6], [-0.1, -0.2]), _unpacked_completion(0.0, [5], [-0.3])]
    raw = _report_bytes("L", "p0", good)
    req = pb.ReportOutcomesRequest.FromString(raw)
    assert [len(c.logprobs) for c in req.outcomes[0].completions] == [2, 1]
    assert lean_report(raw, req, 1.0, True) is None  # not canonical: the per-field path decides
    assert _per_field(req, 1.0)[0][2]  # ... and accepts it (a mixed group, queued)


@pytest.fixture(scope="module", params=["memory", "redis"])
def srv(request, redis_url):
    import uuid

    cfg = ServerConfig(metrics_port=0, snapshot_interval_s=0, stats_interval_s=0.5)
    ns = f"lean-{uuid.uuid4().hex[:10]}"
    s = start_background_server(request.param, redis_url, ns, cfg)
    try:
        yield s
    finally:
        s.stop()
        if request.param == "redis":
            drop_namespace(redis_url, ns)


def test_bad_values_in_an_unpacked_report_are_refused_over_grpc(srv):
    with grpc.insecure_channel(srv.address) as ch:
        stub = pb_grpc.PriorityServiceStub(ch)
        stub.RegisterProblems(iter([pb.RegisterProblemsRequest(problems=[pb.Problem(id="p0", prompt="q", answer="1")])]),
                              timeout=10)
        lease = stub.SampleProblems(pb.SampleProblemsRequest(batch_size=1), timeout=10)
        report = ch.unary_unary("/prioreplay.v1.PriorityService/ReportOutcomes")  # bytes in, bytes out
        for comps, what in (([_unpacked_completion(1.0, [5, 6], [-0.1, NAN]), _unpacked_completion(0.0, [5], [-0.3])],
                             "logprobs[1] = nan"),
                            ([_unpacked_completion(1.0, [5, 6], [-0.1]), _unpacked_completion(0.0, [5], [-0.3])],
                             "1 logprobs for 2 token_ids")):
            with pytest.raises(grpc.RpcError) as e:
                report(_report_bytes(lease.lease_id, "p0", comps), timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and what in e.value.details(), e.value.details()
        ok = [_unpacked_completion(1.0, [5, 6], [-0.1, -0.2]), _unpacked_completion(0.0, [5], [-0.3])]
        r = pb.ReportOutcomesResponse.FromString(report(_report_bytes(lease.lease_id, "p0", ok), timeout=10))
        assert r.accepted and r.groups_queued == 1
        pulled = stub.PullTrajectories(pb.PullTrajectoriesRequest(max_groups=4), timeout=10)
        assert [list(c.logprobs) for c in pulled.groups[0].completions] == [pytest.approx([-0.1, -0.2]),
                                                                           pytest.approx([-0.3])]


def test_a_canonical_report_is_queued_as_the_learner_reads_it(srv):
    with grpc.insecure_channel(srv.address) as ch:
        stub = pb_grpc.PriorityServiceStub(ch)
        stub.RegisterProblems(iter([pb.RegisterProblemsRequest(problems=[pb.Problem(id="q0", prompt="q", answer="1")])]),
                              timeout=10)
        stub.PullTrajectories(pb.PullTrajectoriesRequest(max_groups=64), timeout=10)  # drain earlier tests' groups
        lease = stub.SampleProblems(pb.SampleProblemsRequest(batch_size=1), timeout=10)
        n = 2000  # over LEAN_MIN_BYTES: the lean path
        comps = [pb.Completion(reward=r, token_ids=[300, 5] * n, logprobs=[-0.25, -0.5] * n, text="x", truncated=True)
                 for r in (1.0, 0.0)]
        out = pb.ProblemOutcome(problem_id=lease.problems[0].problem.id, policy_version=3, prompt_token_ids=[1, 200],
                                completions=comps, sampling_temperature=0.7)
        req = pb.ReportOutcomesRequest(lease_id=lease.lease_id, outcomes=[out])
        assert req.ByteSize() > wire.LEAN_MIN_BYTES
        assert lean_report(req.SerializeToString(), req, 1.0, True) is not None
        assert stub.ReportOutcomes(req, timeout=10).accepted
        g = stub.PullTrajectories(pb.PullTrajectoriesRequest(max_groups=4), timeout=10).groups
        assert len(g) == 1 and g[0].problem_id == out.problem_id and g[0].policy_version == 3
        assert list(g[0].prompt_token_ids) == [1, 200] and list(g[0].completions) == comps
        assert g[0].sampling_temperature == 0.7 and g[0].reported_unix_s > 0 and g[0].delivery_count == 1


@pytest.mark.parametrize("view,message", [("OutcomeView", pb.ProblemOutcome), ("GroupView", pb.TrajectoryGroup)])
def test_the_wire_views_carry_every_field_the_lean_path_copies(view, message):
    """A field added to ProblemOutcome (or to TrajectoryGroup) but not to the lean path's views
    would be dropped from queued groups without any error (top-p was, once): every field of the
    outcome, and every field of the group but the ones the store or the learner set, must be in
    its view with the same number."""
    fields = {f.name: f.number for f in wire._VIEWS[view].DESCRIPTOR.fields}
    skip = {"group_id", "delivery_count"} if message is pb.TrajectoryGroup else set()
    want = {f.name: f.number for f in message.DESCRIPTOR.fields if f.name not in skip}
    assert fields == want
