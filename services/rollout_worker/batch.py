"""The records of one lease in the worker: the generated groups handed from the thread that
generates to the one that verifies and reports (:class:`GeneratedBatch`), and what the lease came
to (:class:`BatchResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prioreplay.problems import ProblemRecord
from prioreplay.v1 import priority_service_pb2 as pb

from .backends.base import GeneratedCompletion


@dataclass(frozen=True)
class BatchResult:
    """What one :meth:`~.worker.RolloutWorker.run_once` did.

    Attributes:
        lease_id: the lease ("" when nothing was leased).
        backpressure: True when the server refused the lease because its trajectory queue is
            over its bound (the learner is behind); the loop waits ``retry_after_s``.
        problems: problems in the lease (B or fewer).
        retry_after_s: the server's hint when the lease was empty or short, seconds.
        reported: True when a report was sent (the server may still refuse it: see accepted).
        accepted: the server's answer (False: lease expired/unknown; None: not reported).
        reason: why a report was not accepted.
        groups_queued / groups_filtered: the server's counts for the report.
        completions: completions generated (B × G).
        tokens: completion tokens generated.
        reward_mean: mean reward over the completions (0.0 when none).
        unservable: problems of the lease reported unservable (prompt too long for the model's
            context); the server quarantines them.
        policy_version: the version that generated the batch.
        reload_s: seconds spent loading new weights before generating (0.0: none).
        generation_s / verification_s: seconds spent generating / verifying.
    """

    lease_id: str = ""
    backpressure: bool = False
    problems: int = 0
    retry_after_s: float = 0.0
    reported: bool = False
    accepted: bool | None = None
    reason: str = ""
    groups_queued: int = 0
    groups_filtered: int = 0
    completions: int = 0
    tokens: int = 0
    reward_mean: float = 0.0
    unservable: int = 0
    policy_version: int = 0
    reload_s: float = 0.0
    generation_s: float = 0.0
    verification_s: float = 0.0


@dataclass
class GeneratedBatch:
    """One lease's groups, generated and not yet verified: what the generating thread hands to
    the one that verifies and reports (:meth:`~.worker.RolloutWorker.finish`).

    Attributes:
        leased: the servable problems with their group sizes, in lease order (B' ≤ B).
        prompts: their prompts as token ids after the chat template (B' lists).
        groups: their completions (B' groups of ``size`` each).
        unservable: ids of the lease's problems whose prompt does not fit the model's context.
        version: the policy version whose weights generated the groups.
        generation_s: seconds in the backend's ``generate``.
        lease: the ``SampleProblems`` answer (empty for :meth:`~.worker.RolloutWorker.generate_batch`).
        reload_s: seconds spent loading this lease's weights before generating (0.0: none).
    """

    leased: list[tuple[ProblemRecord, int]]
    prompts: list[list[int]]
    groups: list[list[GeneratedCompletion]]
    unservable: list[str]
    version: int
    generation_s: float
    lease: pb.SampleProblemsResponse = field(default_factory=pb.SampleProblemsResponse)
    reload_s: float = 0.0
