"""The two halves of the one report decode (``wire.report_groups``) agree, without a server: the
column path (``wire.canonical_groups``) and the per-field checks (``fast=False``).

For canonical reports it must give the same groups (ids, rewards, and payload bytes identical to
rebuilding a ``TrajectoryGroup``) and refuse exactly what the per-field checks refuse; reports in
another valid encoding (unpacked or split packed fields) must fall back to the per-field checks.
The same reports over gRPC: ``tests/system/server/test_report_bytes_over_grpc.py``.
"""

from __future__ import annotations

import math
import random

import pytest

from prioreplay.errors import InvalidArgument
from prioreplay.priority_server import wire
from prioreplay.priority_server.wire import canonical_groups, report_groups
from prioreplay.v1 import priority_service_pb2 as pb
from tests.support.wire_bytes import report_bytes, unpacked_completion

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
            comps.append(
                pb.Completion(
                    reward=rng.choice([0.0, 1.0, 0.5, rng.random()]),
                    token_ids=toks,
                    logprobs=lps,
                    text="t" * rng.randint(0, 200),
                    truncated=rng.random() < 0.5,
                )
            )
        version = rng.randint(0, 5) if not (bad and rng.random() < 0.1) else -1
        temp = rng.choice([0.0, 0.7, 1.0]) if not (bad and rng.random() < 0.1) else rng.choice([NAN, INF, -1.0])
        pid = f"p{k}" if not (bad and rng.random() < 0.05) else ""
        top_p = rng.choice([0.0, 0.9, 1.0]) if not (bad and rng.random() < 0.1) else rng.choice([NAN, 1.5, -0.1])
        outcomes.append(
            pb.ProblemOutcome(
                problem_id=pid,
                policy_version=version,
                sampling_temperature=temp,
                sampling_top_p=top_p,
                prompt_token_ids=[rng.randrange(1 << 17) for _ in range(rng.randint(0, 200))],
                completions=comps,
            )
        )
    return pb.ReportOutcomesRequest(lease_id="L", outcomes=outcomes, rewards_only=rng.random() < 0.2)


def _per_field(req: pb.ReportOutcomesRequest, now: float):
    """What the per-field path gives: [(id, rewards, payload, completion tokens)], or InvalidArgument."""
    return [
        (g.problem_id, g.rewards, g.payload, g.completion_tokens)
        for g in report_groups(req.SerializeToString(), req, now, not req.rewards_only, fast=False)
    ]


@pytest.mark.parametrize("bad", [False, True])
def test_lean_path_gives_the_per_field_result_byte_for_byte(bad, monkeypatch):
    monkeypatch.setattr(wire, "COLUMN_MIN_BYTES", 0)  # small reports too
    rng = random.Random(11 + bad)
    lean_taken = refused = 0
    for trial in range(150):
        req = _random_report(rng, bad)
        raw = req.SerializeToString()
        try:
            expected = _per_field(req, 1234.5)
        except InvalidArgument:
            expected = None
        got = canonical_groups(raw, pb.ReportOutcomesRequest.FromString(raw), 1234.5, not req.rewards_only)
        if expected is None:
            refused += 1
            assert got is None, trial  # the lean path never accepts what the per-field checks refuse
        else:
            assert got == expected, trial
            assert [g.completion_tokens for g in got] == [sum(len(c.token_ids) for c in o.completions) for o in req.outcomes]
            lean_taken += 1
    assert lean_taken > 10 and (refused > 20 if bad else refused == 0), (lean_taken, refused)


def test_non_canonical_encodings_fall_back_to_the_per_field_checks(monkeypatch):
    monkeypatch.setattr(wire, "COLUMN_MIN_BYTES", 0)
    good = [unpacked_completion(1.0, [5, 6], [-0.1, -0.2]), unpacked_completion(0.0, [5], [-0.3])]
    raw = report_bytes("L", "p0", good)
    req = pb.ReportOutcomesRequest.FromString(raw)
    assert [len(c.logprobs) for c in req.outcomes[0].completions] == [2, 1]
    assert canonical_groups(raw, req, 1.0, True) is None  # not canonical: the per-field path decides
    assert _per_field(req, 1.0)[0][2]  # ... and accepts it (a mixed group, queued)


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


def test_a_report_with_left_out_fields_takes_the_lean_path_and_agrees(monkeypatch):
    """Zero rewards and empty token ids / log-probs are left out of the bytes (proto3), so the
    columns view sees fewer values than completions; the lean path must still place every value on
    its completion (not fall back to the per-field path) and agree with it, over many problems."""
    rng = random.Random(7)
    outcomes = []
    for k in range(300):
        comps = []
        for _ in range(8):
            n = rng.choice([0, 0, 3, 200])
            comps.append(
                pb.Completion(
                    reward=rng.choice([0.0, -0.0, 1.0, 0.5]),
                    token_ids=[rng.randrange(1 << 20) for _ in range(n)],
                    logprobs=[-rng.random() for _ in range(n)],
                    text=rng.choice(["", "\u00e9t\u00e9 \u4e2d"]),
                    truncated=rng.random() < 0.3,
                )
            )
        outcomes.append(pb.ProblemOutcome(problem_id=f"p{k}\u00df", policy_version=k % 3, completions=comps))
    req = pb.ReportOutcomesRequest(lease_id="L", outcomes=outcomes)
    raw = req.SerializeToString()
    got = canonical_groups(raw, req, 99.5, True)
    assert got is not None and len(raw) > wire.COLUMN_MIN_BYTES
    assert [tuple(g) for g in got] == _per_field(req, 99.5)
    assert any(math.copysign(1.0, r) < 0 for g in got for r in g.rewards)  # -0.0 kept as sent


def test_plain_grpo_gets_a_payload_for_every_group_on_both_paths(monkeypatch):
    """``--queue-zero-variance``: zero-variance groups get their payload too, byte for byte alike."""
    monkeypatch.setattr(wire, "COLUMN_MIN_BYTES", 0)
    rng = random.Random(5)
    checked = 0
    for _ in range(60):
        req = _random_report(rng, bad=False)
        raw = req.SerializeToString()
        queue = not req.rewards_only
        fast = canonical_groups(raw, pb.ReportOutcomesRequest.FromString(raw), 1.0, queue, zero_variance=True)
        slow = report_groups(raw, req, 1.0, queue, fast=False, zero_variance=True)
        assert fast == [(g.problem_id, g.rewards, g.payload, g.completion_tokens) for g in slow]
        assert all(bool(g.payload) == queue for g in slow)  # every group, zero variance or not
        checked += sum(1 for g in slow if len(set(g.rewards)) == 1 and queue)
    assert checked > 5  # zero-variance groups were among them
