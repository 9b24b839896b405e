"""The wire conversions of :mod:`prioreplay.convert`: round trips and the rules each one applies."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prioreplay import rules
from prioreplay.convert import (
    DEFAULT_VERIFIER,
    STATS_FIELDS,
    lease_to_proto,
    leased_problems,
    outcome_to_group,
    outcome_to_proto,
    problem_from_proto,
    problem_to_proto,
    stats_to_proto,
    trajectory_payload,
)
from prioreplay.problems import ProblemRecord
from prioreplay.rules import Pool
from prioreplay.v1 import priority_service_pb2 as pb

text = st.text(min_size=1, max_size=30)
records = st.builds(
    ProblemRecord,
    id=text,
    prompt=text,
    answer=text,
    verifier=st.sampled_from(["exact", "math", "gsm8k"]),
    metadata=st.dictionaries(text, st.text(max_size=10), max_size=3),
)


@given(records)
def test_a_problem_survives_the_round_trip_through_its_proto(record):
    assert problem_from_proto(problem_to_proto(record)) == record
    wire = pb.Problem.FromString(problem_to_proto(record).SerializeToString())
    assert problem_from_proto(wire) == record


def test_a_problem_without_a_verifier_reads_as_the_default():
    assert problem_from_proto(pb.Problem(id="a", prompt="1+1?", answer="2")).verifier == DEFAULT_VERIFIER == "exact"


@dataclass(frozen=True)
class _Sampled:
    problem: ProblemRecord
    priority: float
    source: Pool
    group_size: int | None = None


@dataclass(frozen=True)
class _Lease:
    lease_id: str
    deadline: float
    problems: list
    policy_version: int
    weights_uri: str
    retry_after_s: float
    step: int


def test_a_lease_reaches_the_worker_with_its_problems_sizes_and_version():
    a, b = ProblemRecord("a", "1+1?", "2"), ProblemRecord("b", "2+2?", "4", verifier="math", metadata={"k": "v"})
    lease = _Lease(
        "L1",
        1234.5,
        [_Sampled(a, 0.25, Pool.HEAP), _Sampled(b, 0.1, Pool.SOLVED, group_size=2)],
        policy_version=7,
        weights_uri="/w/v-7",
        retry_after_s=0.0,
        step=3,
    )
    resp = pb.SampleProblemsResponse.FromString(lease_to_proto(lease).SerializeToString())
    assert (resp.lease_id, resp.lease_deadline_unix_s, resp.policy_version, resp.weights_uri, resp.step) == (
        "L1",
        1234.5,
        7,
        "/w/v-7",
        3,
    )
    assert [(lp.priority, lp.source, lp.group_size) for lp in resp.problems] == [
        (0.25, pb.POOL_HEAP, 0),
        (0.1, pb.POOL_SOLVED, 2),
    ]
    assert leased_problems(resp, group_size=8) == [(a, 8), (b, 2)]  # 0 on the wire: the worker's own G


def test_an_empty_lease_has_no_deadline_and_keeps_its_retry_hint():
    resp = lease_to_proto(_Lease("", 99.0, [], 0, "", 1.5, 0))
    assert (resp.lease_deadline_unix_s, resp.retry_after_s, len(resp.problems)) == (0.0, 1.5, 0)


@dataclass
class _Generated:
    token_ids: list
    logprobs: list
    text: str
    truncated: bool = False


def test_a_generated_group_becomes_an_outcome_and_a_queued_trajectory_group():
    gen = [_Generated([5, 6], [-0.5, 1e-4], "x"), _Generated([7], [-0.25], "y", truncated=True)]
    o = outcome_to_proto("p", 4, [1.0, 0.0], generated=gen, prompt_token_ids=[1, 2, 3], temperature=0.7, top_p=0.9)
    o = pb.ProblemOutcome.FromString(o.SerializeToString())
    assert [list(c.token_ids) for c in o.completions] == [[5, 6], [7]]
    assert [list(c.logprobs) for c in o.completions] == [[-0.5, 0.0], [-0.25]]  # above 0 (rounding) sent as 0
    assert [(c.text, c.truncated, c.reward) for c in o.completions] == [("x", False, 1.0), ("y", True, 0.0)]
    group = outcome_to_group(o, reported_unix_s=12.0)
    assert (group.problem_id, group.rewards) == ("p", (1.0, 0.0))
    assert group.completion_tokens == 3  # 2 + 1 generated tokens: the store's token mean reads it
    g = pb.TrajectoryGroup.FromString(group.payload)
    assert (g.problem_id, g.policy_version, list(g.prompt_token_ids), g.reported_unix_s) == ("p", 4, [1, 2, 3], 12.0)
    assert (g.sampling_temperature, g.sampling_top_p) == pytest.approx((0.7, 0.9))
    assert list(g.completions) == list(o.completions) and not g.group_id and not g.delivery_count


@pytest.mark.parametrize("rewards", [(1.0, 1.0), (0.0, 0.0), (0.5, 0.5)])
def test_only_a_mixed_group_gets_a_payload(rewards):
    o = outcome_to_proto("p", 0, rewards)
    assert rules.classify(rewards) is not rules.GroupKind.MIXED
    assert outcome_to_group(o, 1.0).payload == b""
    mixed = outcome_to_proto("p", 0, (1.0, 0.0))
    assert outcome_to_group(mixed, 1.0).payload == trajectory_payload(mixed, 1.0) != b""
    assert outcome_to_group(mixed, 1.0, queue=False).payload == b""  # rewards only: never queued


def test_a_rewards_only_outcome_carries_rewards_and_nothing_else():
    o = outcome_to_proto("p", 2, [1.0, 0.0, 1.0])
    assert [c.reward for c in o.completions] == [1.0, 0.0, 1.0]
    assert not any(c.token_ids or c.logprobs or c.text for c in o.completions) and not o.prompt_token_ids


def test_completions_and_rewards_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="2 completions for 1 rewards"):
        outcome_to_proto("p", 0, [1.0], generated=[_Generated([1], [-1.0], "a"), _Generated([2], [-1.0], "b")])


def test_stats_carry_every_field_of_the_proto_and_the_clients():
    class Stats:
        pass

    s = Stats()
    for i, name in enumerate(STATS_FIELDS):
        field = pb.GetStatsResponse.DESCRIPTOR.fields_by_name[name]
        value = {field.TYPE_STRING: f"v{i}", field.TYPE_DOUBLE: i + 0.5}.get(field.type, i)
        setattr(s, name, [value, value] if field.is_repeated else value)
    clients = [pb.ClientStats(source=pb.CLIENT_SOURCE_TRL, leases=3)]
    resp = pb.GetStatsResponse.FromString(stats_to_proto(s, clients).SerializeToString())
    for name in STATS_FIELDS:
        got = getattr(resp, name)
        assert (list(got) if not isinstance(got, (int, float, str)) else got) == getattr(s, name), name
    assert list(resp.clients) == clients
    delattr(s, STATS_FIELDS[0])
    with pytest.raises(AttributeError):
        stats_to_proto(s)
