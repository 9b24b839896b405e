"""The values the store interface takes and returns (see the semantics in :mod:`.store`).

Server-side only: the problem record itself, which every role uses, is
:class:`prioreplay.problems.ProblemRecord`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prioreplay.problems import ProblemRecord
from prioreplay.rules import GroupKind, Pool, Stats


@dataclass(frozen=True)
class SampledProblem:
    """One problem of a lease: the problem, its priority when sampled, and where it came from.

    ``group_size`` is the sampler's per-problem G (:class:`~prioreplay.priority_server.samplers.Pick`);
    None, the worker's own G, for every sampler so far (the response has no field for it yet).

    ``wire`` is the problem's serialized ``Problem`` (:func:`prioreplay.convert.problem_bytes`)
    where the store keeps it with the record (the memory store); b"": not kept, the servicer
    serializes ``problem``. It is a cache of ``problem``, so it takes no part in comparisons.
    """

    problem: ProblemRecord
    priority: float
    source: Pool
    group_size: int | None = None
    wire: bytes = field(default=b"", compare=False, repr=False)


@dataclass(frozen=True)
class Lease:
    """The answer to ``sample``. ``lease_id`` is "" when ``problems`` is empty.

    ``paced``: the pace bound left no room (store/base.py, "sample" 1b); nothing was leased and
    ``retry_after_s`` is then the seconds until the earliest live lease deadline (``math.inf``
    with none), not a wire value: the server's pacing (:mod:`..pacing`) answers the client.
    """

    lease_id: str
    deadline: float  # unix seconds
    problems: list[SampledProblem]
    policy_version: int
    weights_uri: str
    retry_after_s: float
    step: int
    paced: bool = False


@dataclass(frozen=True)
class Renewal:
    """The answer to ``renew``: the lease's new deadline (unix seconds) and the problems it still holds."""

    deadline: float
    problems: int


@dataclass(frozen=True)
class GroupOutcome:
    """One reported group: rewards for the statistics, an opaque payload for the learner.

    Attributes:
        problem_id: a problem of the lease.
        rewards: the G rewards in completion order, each in [0, 1].
        payload: serialized ``TrajectoryGroup`` (without group_id / delivery_count), queued
            verbatim when the group is mixed; empty: never queued (a rewards-only report).
        completion_tokens: generated tokens of the whole group (the completions' token ids
            summed); 0: not known (no token ids sent), the problem's token mean is unchanged.
    """

    problem_id: str
    rewards: tuple[float, ...]
    payload: bytes = b""
    completion_tokens: int = 0


@dataclass(frozen=True)
class ReportResult:
    """The answer to ``report``: accepted, or the reason it was not; groups queued / filtered."""

    accepted: bool
    reason: str = ""
    groups_queued: int = 0
    groups_filtered: int = 0
    skipped: int = 0  # outcomes of problems an earlier part of the report already applied
    quarantined: int = 0  # problems of the report's ``unservable`` list, now quarantined
    #: The kind of each outcome passed to ``report``, in order, as the store classified it (also
    #: the outcomes an earlier part already applied); () for a refused report. The servicer's
    #: traffic tally counts these instead of classifying every group again.
    kinds: tuple[GroupKind, ...] = ()


@dataclass(frozen=True)
class Delivery:
    """A trajectory group handed to a learner."""

    group_id: str
    payload: bytes
    delivery_count: int


@dataclass(frozen=True)
class ProblemState:
    """A problem's full state, for tests and debugging."""

    problem: ProblemRecord
    stats: Stats
    pool: Pool
    score: float  # heap: priority; pools: last tested step (policy version with retest_versions); leased: its return score
    priority: float


@dataclass
class StoreStats:
    """Counts behind ``GetStats`` and the metrics (field meanings as in the proto)."""

    problems: int = 0
    heap_size: int = 0
    solved: int = 0
    unsolved: int = 0
    leased: int = 0
    active_leases: int = 0
    quarantined: int = 0
    step: int = 0
    policy_version: int = 0
    weights_uri: str = ""
    priority_histogram: list[int] = field(default_factory=list)
    priority_bucket_edges: list[float] = field(default_factory=list)
    groups_mixed: int = 0
    groups_all_correct: int = 0
    groups_all_wrong: int = 0
    groups_constant: int = 0
    forgetting_events: int = 0
    breakthroughs: int = 0
    lease_expiries: int = 0
    queue_depth: int = 0
    pending_groups: int = 0
    completions_reported: int = 0
    reward_sum: float = 0.0
    late_reports: int = 0
    groups_acked: int = 0
    unseen: int = 0  # registered problems without statistics (n == 0): no accepted report, no warm start yet
    #: The priority an unseen heap problem holds now (``--unseen-prior``: ω_unseen; off: ``rules.priority(Stats())``).
    unseen_priority: float = 0.25

    @property
    def groups_total(self) -> int:
        return self.groups_mixed + self.groups_all_correct + self.groups_all_wrong + self.groups_constant

    @property
    def effective_group_fraction(self) -> float:
        """Mixed groups / all groups reported (0.0 before any report)."""
        total = self.groups_total
        return self.groups_mixed / total if total else 0.0
