"""The lean PullTrajectories path: groups go out as the bytes they were queued as, plus their
delivery fields, and decode to what the per-field path (decode, set the fields, encode) gives;
over gRPC on both stores, with the answer's size limits kept.
"""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.message import DecodeError

from prioreplay.convert import trajectory_payload
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.wire import encode_varint, per_field_group, pull_response, pulled_group
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import server_in_namespace


def outcome(pid: str, tokens: int = 3, temperature: float = 0.7) -> pb.ProblemOutcome:
    comps = [
        pb.Completion(reward=r, token_ids=[300 + k for k in range(tokens)], logprobs=[-0.25] * tokens, text="é", truncated=r > 0)
        for r in (1.0, 0.0)
    ]
    return pb.ProblemOutcome(
        problem_id=pid, policy_version=5, prompt_token_ids=[1, 70000], completions=comps, sampling_temperature=temperature
    )


@pytest.mark.parametrize("gid,count", [("1700000000000-0", 1), ("1-18446744073709551615", 2**32 - 1)])
def test_a_pulled_group_decodes_as_the_per_field_group(gid, count):
    payload = trajectory_payload(outcome("p0", tokens=200), 1234.5)
    lean = pulled_group(payload, gid, count)
    assert lean.startswith(payload)  # the queued bytes, not encoded again
    assert pb.TrajectoryGroup.FromString(lean) == per_field_group(payload, gid, count)


def test_delivery_fields_already_in_a_payload_are_overridden_as_the_per_field_path_does():
    stale = pb.TrajectoryGroup(group_id="old", delivery_count=9, problem_id="p0").SerializeToString()
    assert pb.TrajectoryGroup.FromString(pulled_group(stale, "5-0", 1)) == per_field_group(stale, "5-0", 1)


def test_a_payload_that_is_not_a_group_is_refused_by_both_paths():
    for bad in (b"\x2a\x05\x01", b"\xff"):  # a truncated completion; a bad tag
        with pytest.raises(DecodeError):
            per_field_group(bad, "1-0", 1)
        with pytest.raises(DecodeError):
            pulled_group(bad, "1-0", 1)


def test_the_answer_decodes_as_the_per_field_answer():
    payloads = [trajectory_payload(outcome(f"p{i}", tokens=i), float(i)) for i in range(4)]
    ids = [(f"{i}-0", i + 1) for i in range(4)]
    for depth in (0, 1, 300):
        lean = pull_response([pulled_group(p, g, c) for p, (g, c) in zip(payloads, ids, strict=True)], depth)
        per_field = pb.PullTrajectoriesResponse(
            groups=[per_field_group(p, g, c) for p, (g, c) in zip(payloads, ids, strict=True)], queue_depth=depth
        )
        assert pb.PullTrajectoriesResponse.FromString(lean) == per_field
        assert lean == per_field.SerializeToString() or len(lean) == per_field.ByteSize()
    assert pull_response([], 0) == b""
    assert [encode_varint(n) for n in (0, 127, 128, 300)] == [b"\x00", b"\x7f", b"\x80\x01", b"\xac\x02"]


@pytest.fixture(scope="module", params=["memory", "redis"])
def srv(request, redis_url):
    cfg = ServerConfig(metrics_port=0, snapshot_interval_s=0, stats_interval_s=0.5, max_message_mb=1, redelivery_timeout_s=3600)
    with server_in_namespace(request.param, redis_url, "leanpull", cfg) as s:
        yield s


def _report(stub, outcomes: list[pb.ProblemOutcome]) -> None:
    problems = [pb.Problem(id=o.problem_id, prompt="q", answer="1") for o in outcomes]
    stub.RegisterProblems(iter([pb.RegisterProblemsRequest(problems=problems)]), timeout=10)
    lease = stub.SampleProblems(pb.SampleProblemsRequest(batch_size=len(outcomes)), timeout=10)
    by_id = {o.problem_id: o for o in outcomes}
    mine = [by_id[p.problem.id] for p in lease.problems]
    assert len(mine) == len(outcomes)
    r = stub.ReportOutcomes(pb.ReportOutcomesRequest(lease_id=lease.lease_id, outcomes=mine), timeout=10)
    assert r.accepted and r.groups_queued == len(outcomes)


def test_pulled_groups_are_the_reported_outcomes_over_grpc(srv):
    with grpc.insecure_channel(srv.address, options=[("grpc.max_receive_message_length", 4 << 20)]) as ch:
        stub = pb_grpc.PriorityServiceStub(ch)
        outs = [outcome("a0", tokens=2), outcome("a1", tokens=4000, temperature=0.0)]  # per-field and lean reports
        _report(stub, outs)
        r = stub.PullTrajectories(pb.PullTrajectoriesRequest(max_groups=8, consumer="c1"), timeout=10)
        got = {g.problem_id: g for g in r.groups}
        assert sorted(got) == ["a0", "a1"] and r.queue_depth == 0
        for o in outs:
            g = got[o.problem_id]
            assert list(g.completions) == list(o.completions) and list(g.prompt_token_ids) == list(o.prompt_token_ids)
            assert (g.policy_version, g.sampling_temperature, g.delivery_count) == (5, o.sampling_temperature, 1)
            assert g.group_id and g.reported_unix_s > 0
        own = pb.PullTrajectoriesRequest(max_groups=8, consumer="c1", include_own_pending=True)
        again = stub.PullTrajectories(own, timeout=10)
        assert sorted((g.problem_id, g.delivery_count) for g in again.groups) == [("a0", 2), ("a1", 2)]
        stub.AckTrajectories(pb.AckTrajectoriesRequest(group_ids=[g.group_id for g in again.groups]), timeout=10)


def test_the_size_limits_hold_on_the_lean_path(srv):
    with grpc.insecure_channel(srv.address, options=[("grpc.max_receive_message_length", 4 << 20)]) as ch:
        stub = pb_grpc.PriorityServiceStub(ch)
        for pid in ("b0", "b1"):  # ~0.67 MB each: one per report, one per answer
            _report(stub, [outcome(pid, tokens=50_000)])
        one = stub.PullTrajectories(pb.PullTrajectoriesRequest(max_groups=8, consumer="c2"), timeout=10)
        two = stub.PullTrajectories(pb.PullTrajectoriesRequest(max_groups=8, consumer="c2"), timeout=10)
        assert len(one.groups) == 1 and len(two.groups) == 1
        assert {one.groups[0].problem_id, two.groups[0].problem_id} == {"b0", "b1"}
        stub.AckTrajectories(pb.AckTrajectoriesRequest(group_ids=[one.groups[0].group_id]), timeout=10)
        with pytest.raises(grpc.RpcError) as e:  # the learner's own limit, below one group
            stub.PullTrajectories(
                pb.PullTrajectoriesRequest(max_groups=8, consumer="c2", include_own_pending=True, max_response_bytes=100_000),
                timeout=10,
            )
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_response_bytes" in e.value.details()
        assert two.groups[0].problem_id in e.value.details()
        own = pb.PullTrajectoriesRequest(max_groups=8, consumer="c2", include_own_pending=True)
        back = stub.PullTrajectories(own, timeout=10)
        assert [g.problem_id for g in back.groups] == [two.groups[0].problem_id]  # stayed queued
        stub.AckTrajectories(pb.AckTrajectoriesRequest(group_ids=[back.groups[0].group_id]), timeout=10)


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_plain_grpo_queues_zero_variance_groups_over_grpc(kind, redis_url):
    """--queue-zero-variance: an all-correct group reaches the learner (the grpo arm)."""
    cfg = ServerConfig(metrics_port=0, snapshot_interval_s=0, stats_interval_s=0.5, queue_zero_variance=True)
    with server_in_namespace(kind, redis_url, "zv", cfg) as s, grpc.insecure_channel(s.address) as ch:
        stub = pb_grpc.PriorityServiceStub(ch)
        same = outcome("z0")
        for c in same.completions:
            c.reward = 1.0
        _report(stub, [same, outcome("z1")])
        r = stub.PullTrajectories(pb.PullTrajectoriesRequest(max_groups=8, consumer="c"), timeout=10)
        assert sorted(g.problem_id for g in r.groups) == ["z0", "z1"]
        assert [c.reward for g in r.groups if g.problem_id == "z0" for c in g.completions] == [1.0, 1.0]
