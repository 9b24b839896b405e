"""The lean ReportOutcomes path over gRPC, on both stores: bad values hidden in a non-canonical
encoding are still refused, and a canonical report is queued as the learner reads it.

The path's agreement with the per-field checks, without a server: ``tests/unit/wire/test_report_bytes_path.py``.
"""

from __future__ import annotations

import math

import grpc
import pytest

from prioreplay.priority_server import wire
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.wire import canonical_groups
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import server_in_namespace
from tests.support.wire_bytes import report_bytes, unpacked_completion

NAN = math.nan


@pytest.fixture(scope="module", params=["memory", "redis"])
def srv(request, redis_url):
    cfg = ServerConfig(metrics_port=0, snapshot_interval_s=0, stats_interval_s=0.5)
    with server_in_namespace(request.param, redis_url, "lean", cfg) as s:
        yield s


def test_bad_values_in_an_unpacked_report_are_refused_over_grpc(srv):
    with grpc.insecure_channel(srv.address) as ch:
        stub = pb_grpc.PriorityServiceStub(ch)
        stub.RegisterProblems(
            iter([pb.RegisterProblemsRequest(problems=[pb.Problem(id="p0", prompt="q", answer="1")])]), timeout=10
        )
        lease = stub.SampleProblems(pb.SampleProblemsRequest(batch_size=1), timeout=10)
        report = ch.unary_unary("/prioreplay.v1.PriorityService/ReportOutcomes")  # bytes in, bytes out
        for comps, what in (
            ([unpacked_completion(1.0, [5, 6], [-0.1, NAN]), unpacked_completion(0.0, [5], [-0.3])], "logprobs[1] = nan"),
            ([unpacked_completion(1.0, [5, 6], [-0.1]), unpacked_completion(0.0, [5], [-0.3])], "1 logprobs for 2 token_ids"),
        ):
            with pytest.raises(grpc.RpcError) as e:
                report(report_bytes(lease.lease_id, "p0", comps), timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and what in e.value.details(), e.value.details()
        ok = [unpacked_completion(1.0, [5, 6], [-0.1, -0.2]), unpacked_completion(0.0, [5], [-0.3])]
        r = pb.ReportOutcomesResponse.FromString(report(report_bytes(lease.lease_id, "p0", ok), timeout=10))
        assert r.accepted and r.groups_queued == 1
        pulled = stub.PullTrajectories(pb.PullTrajectoriesRequest(max_groups=4), timeout=10)
        assert [list(c.logprobs) for c in pulled.groups[0].completions] == [pytest.approx([-0.1, -0.2]), pytest.approx([-0.3])]


def test_a_canonical_report_is_queued_as_the_learner_reads_it(srv):
    with grpc.insecure_channel(srv.address) as ch:
        stub = pb_grpc.PriorityServiceStub(ch)
        stub.RegisterProblems(
            iter([pb.RegisterProblemsRequest(problems=[pb.Problem(id="q0", prompt="q", answer="1")])]), timeout=10
        )
        stub.PullTrajectories(pb.PullTrajectoriesRequest(max_groups=64), timeout=10)  # drain earlier tests' groups
        lease = stub.SampleProblems(pb.SampleProblemsRequest(batch_size=1), timeout=10)
        n = 2000  # over COLUMN_MIN_BYTES: the lean path
        comps = [
            pb.Completion(reward=r, token_ids=[300, 5] * n, logprobs=[-0.25, -0.5] * n, text="x", truncated=True)
            for r in (1.0, 0.0)
        ]
        out = pb.ProblemOutcome(
            problem_id=lease.problems[0].problem.id,
            policy_version=3,
            prompt_token_ids=[1, 200],
            completions=comps,
            sampling_temperature=0.7,
        )
        req = pb.ReportOutcomesRequest(lease_id=lease.lease_id, outcomes=[out])
        assert req.ByteSize() > wire.COLUMN_MIN_BYTES
        assert canonical_groups(req.SerializeToString(), req, 1.0, True) is not None
        assert stub.ReportOutcomes(req, timeout=10).accepted
        g = stub.PullTrajectories(pb.PullTrajectoriesRequest(max_groups=4), timeout=10).groups
        assert len(g) == 1 and g[0].problem_id == out.problem_id and g[0].policy_version == 3
        assert list(g[0].prompt_token_ids) == [1, 200] and list(g[0].completions) == comps
        assert g[0].sampling_temperature == 0.7 and g[0].reported_unix_s > 0 and g[0].delivery_count == 1
