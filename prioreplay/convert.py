"""Every conversion between the wire messages (:mod:`prioreplay.v1`) and the domain values, in one place.

The servicer, the client, the rollout worker, the integrations and ``prioreplay load`` convert
through these functions, so a field added to the proto is written down once:

=====================================  ==============================================================
:func:`problem_to_proto` / ``_from_``  ``ProblemRecord`` ⇄ ``Problem`` (loaders, the servicer, the worker)
:func:`problem_bytes`                  ``ProblemRecord`` → serialized ``Problem`` (the memory store, once per record)
:func:`lease_to_proto`                 the store's lease → ``SampleProblemsResponse`` (the lean path's reference)
:func:`leased_problems`                ``SampleProblemsResponse`` → (problem, group size) (the worker)
:func:`outcome_to_proto`               a scored group → ``ProblemOutcome`` (the worker, the integrations)
:func:`outcome_to_group`               ``ProblemOutcome`` → (problem id, rewards, queued payload) (servicer)
:func:`trajectory_payload`             ``ProblemOutcome`` → serialized ``TrajectoryGroup`` (servicer)
:func:`stats_to_proto`                 the store's statistics → ``GetStatsResponse`` (the servicer)
=====================================  ==============================================================

The lean ``ReportOutcomes`` path (``prioreplay.priority_server.wire.report_groups``) reads the same
fields from the received bytes for speed; ``tests/system/server/test_report_bytes_over_grpc.py`` checks that it
gives exactly what :func:`outcome_to_group` gives. The servicer answers SampleProblems with
``wire.lease_response``, which writes the bytes of :func:`lease_to_proto`'s message from the
``Problem`` bytes of :func:`problem_bytes` (``tests/unit/wire/test_sample_bytes_path.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol

from prioreplay import rules
from prioreplay.problems import ProblemRecord
from prioreplay.v1 import priority_service_pb2 as pb

#: The verifier of a problem whose ``Problem.verifier`` is empty (the proto's documented default).
DEFAULT_VERIFIER = "exact"


# -- problems ------------------------------------------------------------------------------------
def problem_to_proto(problem: ProblemRecord) -> pb.Problem:
    """The proto ``Problem`` of a :class:`~prioreplay.problems.ProblemRecord` (every field copied)."""
    return pb.Problem(
        id=problem.id, prompt=problem.prompt, answer=problem.answer, verifier=problem.verifier, metadata=dict(problem.metadata)
    )


def problem_bytes(problem: ProblemRecord) -> bytes:
    """The serialized ``Problem`` of a record: ``problem_to_proto(problem).SerializeToString()``.

    The memory store keeps these bytes with each record (built when registered) and the lean
    SampleProblems path (``prioreplay.priority_server.wire.lease_response``) copies them into the
    answer instead of building a ``Problem`` message per leased problem. The ``metadata`` map is
    written in the record's dict order, as :func:`problem_to_proto` writes it.
    """
    return problem_to_proto(problem).SerializeToString()


def problem_from_proto(p: pb.Problem) -> ProblemRecord:
    """The :class:`~prioreplay.problems.ProblemRecord` of a proto ``Problem``; an empty verifier
    means :data:`DEFAULT_VERIFIER`. Not validated here (the store validates what it registers)."""
    return ProblemRecord(
        id=p.id, prompt=p.prompt, answer=p.answer, verifier=p.verifier or DEFAULT_VERIFIER, metadata=dict(p.metadata)
    )


# -- leases --------------------------------------------------------------------------------------
class SampledLike(Protocol):
    """What :func:`lease_to_proto` reads of one leased problem (the store's ``SampledProblem``)."""

    problem: ProblemRecord
    priority: float
    source: int  # a ``rules.Pool`` (its values are the proto's ``Pool``)
    group_size: int | None  # the sampler's G for this problem; None: the worker's own


class LeaseLike(Protocol):
    """What :func:`lease_to_proto` reads of a lease (the store's ``Lease``)."""

    lease_id: str
    deadline: float  # unix seconds
    problems: Sequence[SampledLike]
    policy_version: int
    weights_uri: str
    retry_after_s: float
    step: int


def lease_to_proto(lease: LeaseLike) -> pb.SampleProblemsResponse:
    """The ``SampleProblemsResponse`` of a lease; an empty lease has no deadline (0.0)."""
    return pb.SampleProblemsResponse(
        lease_id=lease.lease_id,
        lease_deadline_unix_s=lease.deadline if lease.problems else 0.0,
        problems=[
            pb.LeasedProblem(
                problem=problem_to_proto(s.problem),
                priority=s.priority,
                source=int(s.source),  # type: ignore[arg-type]  # protobuf stubs type enum fields as the enum; the int value is valid
                group_size=s.group_size or 0,
            )
            for s in lease.problems
        ],
        policy_version=lease.policy_version,
        weights_uri=lease.weights_uri,
        retry_after_s=lease.retry_after_s,
        step=lease.step,
    )


def leased_problems(lease: pb.SampleProblemsResponse, group_size: int) -> list[tuple[ProblemRecord, int]]:
    """Each leased problem with the number of completions to generate for it, in lease order:
    ``LeasedProblem.group_size`` where the sampler set it (a screening probe), else ``group_size``
    (the client's G, >= 1)."""
    return [(problem_from_proto(lp.problem), lp.group_size or group_size) for lp in lease.problems]


# -- outcomes ------------------------------------------------------------------------------------
class GeneratedLike(Protocol):
    """What :func:`outcome_to_proto` reads of a generated completion (the backends' ``GeneratedCompletion``)."""

    token_ids: Sequence[int]
    logprobs: Sequence[float]
    text: str
    truncated: bool


def outcome_to_proto(
    problem_id: str,
    policy_version: int,
    rewards: Sequence[float],
    generated: Sequence[GeneratedLike] | None = None,
    prompt_token_ids: Sequence[int] = (),
    temperature: float = 0.0,
    top_p: float = 0.0,
    passed: Sequence[bool] | None = None,
) -> pb.ProblemOutcome:
    """One reported group as a ``ProblemOutcome``.

    Args:
        problem_id: a problem of the lease.
        policy_version: the version that generated the group.
        rewards: one reward per completion, in [0, 1] (the server checks them).
        generated: the completions behind ``rewards`` (token ids, behaviour log-probs in nats,
            text, truncated), one per reward; None: a rewards-only group (the caller trains on
            its own). Log-probabilities above 0 (float32 rounding of log-softmax) are sent as 0.
        prompt_token_ids: the prompt after the chat template (T,).
        temperature, top_p: the sampling parameters of the group (0: not sent).
        passed: each completion's pass/fail under the client's pass rule (reward plugins,
            :mod:`prioreplay.rewards`); None: not sent (pass is then reward == 1).

    Raises:
        ValueError: ``generated`` or ``passed`` and ``rewards`` differ in length.
    """
    if passed is not None and len(passed) != len(rewards):
        raise ValueError(f"problem {problem_id!r}: {len(passed)} pass flags for {len(rewards)} rewards; give one per completion")
    if generated is None:
        completions = [pb.Completion(reward=r) for r in rewards]
    else:
        if len(generated) != len(rewards):
            raise ValueError(
                f"problem {problem_id!r}: {len(generated)} completions for {len(rewards)} rewards; give one reward per completion"
            )
        completions = [
            pb.Completion(
                reward=r, token_ids=g.token_ids, logprobs=[min(lp, 0.0) for lp in g.logprobs], text=g.text, truncated=g.truncated
            )
            for g, r in zip(generated, rewards, strict=True)
        ]
    if passed is not None:
        for c, flag in zip(completions, passed, strict=True):
            c.passed = bool(flag)
    return pb.ProblemOutcome(
        problem_id=problem_id,
        policy_version=policy_version,
        prompt_token_ids=prompt_token_ids,
        completions=completions,
        sampling_temperature=temperature,
        sampling_top_p=top_p,
    )


class ReportedGroup(NamedTuple):
    """One reported group as the store takes it (the fields of its ``GroupOutcome``)."""

    problem_id: str
    rewards: tuple[float, ...]
    payload: bytes  # serialized TrajectoryGroup; b"": never queued
    completion_tokens: int = 0  # the group's generated tokens (0: none sent)


def trajectory_fields(o: Any, reported_unix_s: float) -> dict[str, Any]:
    """The fields of the ``TrajectoryGroup`` queued for an outcome ``o`` (a ``ProblemOutcome``, or
    the server's lazily parsed view of one): every field of the outcome plus ``reported_unix_s``
    (unix seconds); ``group_id`` and ``delivery_count`` are set at delivery."""
    return dict(
        problem_id=o.problem_id,
        policy_version=o.policy_version,
        prompt_token_ids=o.prompt_token_ids,
        completions=o.completions,
        reported_unix_s=reported_unix_s,
        sampling_temperature=o.sampling_temperature,
        sampling_top_p=o.sampling_top_p,
    )


def trajectory_payload(o: pb.ProblemOutcome, reported_unix_s: float) -> bytes:
    """The serialized ``TrajectoryGroup`` of an outcome, as queued for the learner
    (:func:`trajectory_fields`)."""
    return pb.TrajectoryGroup(**trajectory_fields(o, reported_unix_s)).SerializeToString()


def outcome_to_group(
    o: pb.ProblemOutcome, reported_unix_s: float, queue: bool = True, zero_variance: bool = False
) -> ReportedGroup:
    """The store's view of a reported outcome: its rewards, and a payload only for a mixed group
    (the only kind the store queues, :func:`prioreplay.rules.classify`; any group with
    ``zero_variance``, the server's ``--queue-zero-variance``) when ``queue`` (False for a
    ``rewards_only`` report). Rewards are not validated here (the store does, for both stores)."""
    rewards = tuple(c.reward for c in o.completions)
    payload = b""
    if queue and rewards and (zero_variance or rules.classify(rewards) is rules.GroupKind.MIXED):
        payload = trajectory_payload(o, reported_unix_s)
    return ReportedGroup(o.problem_id, rewards, payload, sum(len(c.token_ids) for c in o.completions))


# -- statistics ----------------------------------------------------------------------------------
#: ``GetStatsResponse`` fields read from the store's statistics (all but the per-client traffic).
STATS_FIELDS = tuple(f.name for f in pb.GetStatsResponse.DESCRIPTOR.fields if f.name != "clients")


def stats_to_proto(stats: object, clients: Iterable[pb.ClientStats] = ()) -> pb.GetStatsResponse:
    """The ``GetStatsResponse`` of the store's statistics plus this process's traffic per kind of client.

    ``stats`` has one attribute per field of :data:`STATS_FIELDS`, named as in the proto (the
    store's ``StoreStats``; ``effective_group_fraction`` may be a property).

    Raises:
        AttributeError: ``stats`` lacks a field the proto has (add it to the store's statistics).
    """
    return pb.GetStatsResponse(**{name: getattr(stats, name) for name in STATS_FIELDS}, clients=list(clients))


__all__ = [
    "DEFAULT_VERIFIER",
    "problem_to_proto",
    "problem_bytes",
    "problem_from_proto",
    "lease_to_proto",
    "leased_problems",
    "outcome_to_proto",
    "ReportedGroup",
    "trajectory_payload",
    "outcome_to_group",
    "STATS_FIELDS",
    "stats_to_proto",
]
