"""Malformed requests of every RPC and the status code the proto documents for each: written once,
sent over gRPC to both stores by tests/system/server/test_rpc_bad_input.py and handed to the servicer
in-process (memory store, no Redis) by tests/unit/server/test_servicer_validation.py.
"""

from __future__ import annotations

import math

import grpc

from prioreplay.v1 import priority_service_pb2 as pb

#: The servers of these tests take batches (and pulls) of at most this many.
MAX_BATCH = 64
#: Their longest lease, seconds.
MAX_LEASE_S = 3600
INVALID = grpc.StatusCode.INVALID_ARGUMENT
FAILED = grpc.StatusCode.FAILED_PRECONDITION
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
NAN, INF = math.nan, math.inf


def problem(i, **kw) -> pb.Problem:
    return pb.Problem(**{"id": f"p{i}", "prompt": f"{i} + {i} = ?", "answer": str(2 * i), **kw})


def group(rewards=(1.0, 0.0), **kw) -> list[pb.Completion]:
    return [pb.Completion(reward=r, token_ids=[7, 8], logprobs=[-0.5, -1.0], **kw) for r in rewards]


def bad_request_cases(live: pb.SampleProblemsResponse, leased: list[str], other: str):
    """(name, RPC name, request or list of stream chunks, expected code)."""
    lid = live.lease_id

    def report(*outcomes, lease_id=lid, worker_id=""):
        return pb.ReportOutcomesRequest(lease_id=lease_id, outcomes=list(outcomes), worker_id=worker_id)

    def outcome(pid=leased[0], completions=None, **kw):
        return pb.ProblemOutcome(problem_id=pid, completions=group() if completions is None else completions, **kw)

    def reg(*problems):
        return [pb.RegisterProblemsRequest(problems=list(problems))]

    good = outcome(leased[1])
    return [
        # RegisterProblems: a bad problem refuses its chunk
        ("register empty id", "RegisterProblems", reg(problem(100, id="")), INVALID),
        ("register empty prompt", "RegisterProblems", reg(problem(100, prompt="")), INVALID),
        ("register blank prompt", "RegisterProblems", reg(problem(100, prompt="  \n")), INVALID),
        ("register empty answer", "RegisterProblems", reg(problem(100, answer="")), INVALID),
        ("register unknown verifier", "RegisterProblems", reg(problem(100, verifier="python")), INVALID),
        ("register 300-byte id", "RegisterProblems", reg(problem(100, id="x" * 300)), INVALID),
        ("register control char id", "RegisterProblems", reg(problem(100, id="a\nb")), INVALID),
        ("register good then bad in one chunk", "RegisterProblems", reg(problem(100), problem(101, answer="")), INVALID),
        ("register 2 MiB prompt", "RegisterProblems", reg(problem(100, prompt="x" * (2 << 20))), EXHAUSTED),
        # SampleProblems
        ("sample batch 0", "SampleProblems", pb.SampleProblemsRequest(batch_size=0), INVALID),
        ("sample batch > max", "SampleProblems", pb.SampleProblemsRequest(batch_size=MAX_BATCH + 1), INVALID),
        ("sample batch 2^32-1", "SampleProblems", pb.SampleProblemsRequest(batch_size=2**32 - 1), INVALID),
        ("sample negative lease", "SampleProblems", pb.SampleProblemsRequest(batch_size=1, lease_timeout_s=-1), INVALID),
        ("sample NaN lease", "SampleProblems", pb.SampleProblemsRequest(batch_size=1, lease_timeout_s=NAN), INVALID),
        ("sample inf lease", "SampleProblems", pb.SampleProblemsRequest(batch_size=1, lease_timeout_s=INF), INVALID),
        ("sample lease > max", "SampleProblems", pb.SampleProblemsRequest(batch_size=1, lease_timeout_s=3601), INVALID),
        ("sample huge worker id", "SampleProblems", pb.SampleProblemsRequest(batch_size=1, worker_id="w" * 129), INVALID),
        # ReportOutcomes: the whole report is refused
        ("report empty lease id", "ReportOutcomes", report(good, lease_id=""), INVALID),
        ("report empty group", "ReportOutcomes", report(good, outcome(completions=[])), INVALID),
        ("report NaN reward", "ReportOutcomes", report(good, outcome(completions=group((1.0, NAN)))), INVALID),
        ("report inf reward", "ReportOutcomes", report(good, outcome(completions=group((INF, 0.0)))), INVALID),
        ("report reward 1.5", "ReportOutcomes", report(good, outcome(completions=group((1.5, 0.0)))), INVALID),
        ("report reward -0.5", "ReportOutcomes", report(good, outcome(completions=group((-0.5,)))), INVALID),
        (
            "report logprobs/token_ids mismatch",
            "ReportOutcomes",
            report(good, outcome(completions=[pb.Completion(reward=1.0, token_ids=[1, 2, 3], logprobs=[-1.0])])),
            INVALID,
        ),
        (
            "report logprobs without tokens",
            "ReportOutcomes",
            report(good, outcome(completions=[pb.Completion(reward=1.0, logprobs=[-1.0])])),
            INVALID,
        ),
        (
            "report NaN logprob",
            "ReportOutcomes",
            report(good, outcome(completions=[pb.Completion(reward=1.0, token_ids=[1], logprobs=[NAN])])),
            INVALID,
        ),
        (
            "report positive logprob",
            "ReportOutcomes",
            report(good, outcome(completions=[pb.Completion(reward=1.0, token_ids=[1], logprobs=[3.0])])),
            INVALID,
        ),
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
        (
            "report 2 MiB of tokens",
            "ReportOutcomes",
            report(outcome(completions=[pb.Completion(reward=1.0, token_ids=[1] * (1 << 20), logprobs=[-1.0] * (1 << 20))])),
            EXHAUSTED,
        ),
        # PullTrajectories
        ("pull 0 groups", "PullTrajectories", pb.PullTrajectoriesRequest(max_groups=0), INVALID),
        ("pull > max groups", "PullTrajectories", pb.PullTrajectoriesRequest(max_groups=MAX_BATCH + 1), INVALID),
        ("pull 2^32-1 groups", "PullTrajectories", pb.PullTrajectoriesRequest(max_groups=2**32 - 1), INVALID),
        ("pull negative wait", "PullTrajectories", pb.PullTrajectoriesRequest(max_groups=1, wait_s=-1), INVALID),
        ("pull NaN wait", "PullTrajectories", pb.PullTrajectoriesRequest(max_groups=1, wait_s=NAN), INVALID),
        ("pull inf wait", "PullTrajectories", pb.PullTrajectoriesRequest(max_groups=1, wait_s=INF), INVALID),
        ("pull wait 61 s", "PullTrajectories", pb.PullTrajectoriesRequest(max_groups=1, wait_s=61), INVALID),
        ("pull huge consumer", "PullTrajectories", pb.PullTrajectoriesRequest(max_groups=1, consumer="c" * 129), INVALID),
        # PublishPolicy
        ("publish version 0", "PublishPolicy", pb.PublishPolicyRequest(version=0, weights_uri="x"), INVALID),
        ("publish version -1", "PublishPolicy", pb.PublishPolicyRequest(version=-1, weights_uri="x"), INVALID),
        ("publish version -2^63", "PublishPolicy", pb.PublishPolicyRequest(version=-(2**63), weights_uri="x"), INVALID),
        ("publish empty uri", "PublishPolicy", pb.PublishPolicyRequest(version=3, weights_uri=""), INVALID),
        ("publish 5000-byte uri", "PublishPolicy", pb.PublishPolicyRequest(version=3, weights_uri="u" * 5000), INVALID),
        ("publish older version", "PublishPolicy", pb.PublishPolicyRequest(version=1, weights_uri="ckpt/step-1"), FAILED),
        (
            "publish same version, other uri",
            "PublishPolicy",
            pb.PublishPolicyRequest(version=2, weights_uri="ckpt/other"),
            FAILED,
        ),
        # GetStats
        ("stats 1001 buckets", "GetStats", pb.GetStatsRequest(histogram_buckets=1001), INVALID),
        ("stats 2^32-1 buckets", "GetStats", pb.GetStatsRequest(histogram_buckets=2**32 - 1), INVALID),
    ]
