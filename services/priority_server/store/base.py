"""The store interface: one semantics, two implementations (``memory`` and ``redis``).

:class:`Store` validates every request (identically for both stores) and delegates to the
``_impl`` methods. The two implementations must give identical results for the same seed, clock
readings and operations (the differential test checks it). The values it takes and returns are
in :mod:`.records`; the group rules (classify, statistics, priority, destination) are
:mod:`prioreplay.rules`; the samplers are :mod:`.samplers`; how a priority becomes a heap score is
:mod:`.heap_keys`. The exact semantics:

Keys and ordering
    Every problem has a sorted-set *member* :func:`tie_member` ``(id, seed)`` (8 hex chars of a
    seeded hash + the id). The heap orders by (priority desc, member desc), i.e. Redis
    ``ZREVRANGE`` order; each pool orders by (last tested step asc, member asc), i.e. ``ZRANGE``
    order. Strings compare bytewise.

register(problems, replace)
    New id: stats (0, 0, 0), heap with priority ``rules.priority(Stats())`` (0.25 without prior).
    Existing id: text/verifier/metadata replaced, statistics and place kept. Duplicate ids within
    one call: the last wins. Returns (created, updated, total).
    With ``replace`` false (what RegisterProblems sends unless asked): when any problem of the call
    has an id registered (or earlier in the call) with another prompt or answer
    (:func:`same_text` false), the call is refused with :func:`conflict_error` and nothing
    changes (ids collide across datasets; croissant-baker #101). The store API's default is
    ``replace=True`` (the upsert above).

sample(batch_size, lease_timeout_s)
    1. Expire due leases (deadline <= now), at most 64, oldest deadline first (as expire_leases).
    2. step' = step + 1; quota = samplers.retest_quota(B, retest_fraction, step') (0 in ``uniform``):
       f·B per batch with the remainder carried, ⌊f·B·step'⌋ − ⌊f·B·(step' − 1)⌋.
       rng = samplers.XorShift32(samplers.step_seed(seed, step')).
    3. ``heap``/``weighted``: R = up to ``quota`` pool problems whose score (last tested step)
       <= step' − retest_interval, least recently tested first: candidates are merged from both
       pools by (score asc, solved before unsolved, member asc). With ``retest_versions`` k >= 1
       the scores are policy versions (see "report"): R takes those with score <= V − k, V the
       current policy version (0 before the first publish), same order (``retest_interval`` unused).
       Then H = up to B − |R| from the heap:
         ``heap``: the top, in heap order.
         ``weighted``: for each slot, up to 8 tries: u1 = rng.random(), rank = floor(u1·|heap|)
         in heap order; u2 = rng.random(); accept if u2 < (priority / 0.25) ** alpha. If all 8
         tries fail, take the heap's top. (Probability ∝ priority^α by rejection.)
       Then F = up to B − |R| − |H| from the pools regardless of score, same merge order.
       ``uniform``: for each slot: u = rng.random(), idx = floor(u·N) over the concatenation
       [heap in heap order, solved in pool order, unsolved in pool order] of the N problems not
       leased (N shrinks as problems are taken).
    1b. The pace bound (``pace_batches`` K > 0; :mod:`.pace`): ahead = groups queued and never
       delivered + problems in live leases (after step 1's expiries), b = the learner's batch
       (the last declared, ``note_learner_batch``; else ``pace_batch_groups``; else B), room =
       K·b − ahead. room < 1: no lease and nothing else changes, ``paced`` = True, retry_after_s =
       the earliest live lease deadline − now (inf with no lease). Otherwise steps 2-4 run for
       B' = min(B, room) (the retest quota of B' too); retry_after_s still compares with B.
       The declared batch lives in the process (memory; not snapshotted) or in field
       ``learner_batch`` of the policy hash (Redis), read by ``sample.lua``.
    4. Nothing taken: no lease, step unchanged, retry_after_s = max(0.05, min(5, earliest lease
       deadline − now)) or 1.0 when no lease exists. Otherwise step = step'; every taken problem
       is moved to LEASED, remembering (source pool, score) to return it unchanged; the lease
       (random 128-bit hex id) gets deadline now + timeout. Batch order: R, H, F.
       retry_after_s > 0 also when the batch is short (< B), else 0.
renew(lease_id, worker_id, lease_timeout_s)
    Lease unknown, "already reported" or "expired" (a due but unreaped lease is expired first, as by
    a late report: problems returned, ``lease_expiries`` += 1) → NotFound naming the lease and why.
    Sampled with another ``worker_id`` (``sample(..., worker_id)``; "" for none) → FailedPrecondition
    naming both, nothing changes. Otherwise the deadline becomes now + lease_timeout_s (earlier or
    later than before) for the problems the lease still holds (those an earlier part of a report
    applied are gone); a request id that made the lease is remembered until the new deadline. Step,
    statistics, counters and the lease id are unchanged. Returns the deadline and the problems held.
report(lease_id, outcomes)
    Lease not live → accepted=False, reason "unknown lease" / "already reported" / "expired"
    (a due but unreaped lease is expired first), ``late_reports`` += 1, nothing else changes.
    Outcome for a problem not in the lease, or twice → InvalidArgument, nothing changes.
    Otherwise per outcome (in request order): kind = classify(rewards) (rewards within
    rules.EQUAL_REWARDS_TOL are equal); stats = update_stats;
    priority recomputed; destination(kind, pass_rate(rewards), config.bands): heap with score =
    priority, or the pool with score = ``rules.pool_score``: the lease's step, or with
    ``retest_versions`` >= 1 the current policy version (the bands ``--solved-at`` /
    ``--unsolved-at`` also pool a group whose pass rate Σr/G is at or past them; at their
    defaults 1 and 0 only all-correct / all-wrong groups are pooled); counters: groups_<kind>,
    completions_reported += G, reward_sum += Σr, forgetting_events / breakthroughs per
    rules.is_forgetting / is_breakthrough(source, rewards, bands) (a retest that leaves its pool);
    MIXED groups with a non-empty payload append it to the trajectory queue (groups_queued);
    groups of other kinds count as groups_filtered; a MIXED group with an empty payload (a
    rewards-only client that trains on its own) counts as neither and is not queued. Leased
    problems left out of the report return to (source, score).
    The lease becomes "already reported".
    A report in parts (``more_parts``): the outcomes are applied as above, but the lease stays
    live (same deadline) for its problems not yet reported, and nothing is returned to a pool;
    outcomes for problems an earlier part applied are skipped (``skipped``), so a retried part
    changes nothing. The last part (``more_parts`` false), or a part that leaves no problem,
    ends the lease as above. Which problems earlier parts applied is kept for a day (Redis: a
    set per lease) and, in the memory store, not in snapshots.
Retried requests (``sample(..., request_id)``)
    Before anything else: when ``request_id`` names a lease made by an earlier ``sample`` with the
    same id and that lease is live (not reported, not expired, deadline > now), that lease is
    returned again: its id, deadline, step and problems in batch order (priority as when
    sampled: a heap problem's score, a pool problem's ``rules.priority``), the current policy,
    retry_after_s as for a fresh batch of that length (0 when it has ``batch_size`` problems).
    Nothing changes (not even the expiry of due leases). Otherwise the sample runs as above and a
    lease it makes is remembered under the id until its deadline, as ``renew`` moves it (so memory is bounded by the
    leases of the last ``max_lease_timeout_s``). The memory store does not keep these ids in its
    snapshot.
Quarantine (``report(..., unservable)``)
    A live lease's report may name problems the client cannot serve (its prompt is longer than the
    model's context). Each goes to QUARANTINED with statistics, (source, score) unchanged, and is
    never sampled; ``stats().quarantined`` counts them. Registering its id again (with the same or
    a new text) returns it to (source, score). An id not in the lease → InvalidArgument, nothing
    changes (the same check as outcomes). A late report quarantines nothing.
A prior for unseen problems (``unseen_prior``; :mod:`prioreplay.unseen_prior`; ``heap`` only, heap_age_decay 1)
    ``off`` (the default): the rules above as written (a new problem's heap score is
    ``rules.priority(Stats())``). On (``fit`` or a number): an *unseen* problem (statistics n = 0: never
    reported, not warm-started with n > 0) stays in the heap at score :data:`UNSEEN_SCORE` (−1, below
    every priority: the unseen band): registered there, returned there by an expiry, a report that
    leaves it out or a registration that ends its quarantine; its first report places it as any report
    does. Its priority is ω_unseen = ``unseen_prior.unseen_priority(setting, fit, rules.priority(Stats()))``,
    ``fit`` the first-visit sums at the start of the call. ``heap``'s H is the heap in (priority desc,
    member desc) order with every unseen problem at ω_unseen: slot by slot it takes the seen top (the
    greatest score above −1, then the greatest member) when (score, member) > (ω_unseen, the band's
    greatest member), as (double, bytes), else that unseen member. So a fixed prior equal to
    ``rules.priority(Stats())`` leases exactly what ``off`` leases. ``SampledProblem.priority`` of an
    unseen heap problem (sampled or replayed): ω_unseen at that call. ``stats``: ``unseen_priority`` =
    ω_unseen (``rules.priority(Stats())`` when off); the histogram counts the band's problems in the
    bucket of ω_unseen. ``problem_state`` shows score −1 and ``rules.priority`` of the statistics.
    First visits, kept whether the prior is on or off: every applied outcome of a problem with n = 0
    before it and G >= 2, in request order, is ``fit = unseen_prior.observe(fit, G, p)``, p =
    ``rules.priority`` of the statistics after it (``dump()["unseen_fit"]``: (visits, priority sum)).
    Between off and on the setting is fixed for a namespace's life (``claim_settings`` refuses it
    even with ``accept_changes``); ``fit`` <-> a number is an ordinary change.
expire_leases()
    Every lease with deadline <= now (at most ``limit``, oldest first) returns its problems to
    (source, score) with statistics unchanged, lease_expiries += 1, becomes "expired".
Trajectory queue (Redis stream + consumer group semantics)
    pull(consumer, max_groups, include_own_pending): first (if asked) this consumer's own pending
    deliveries, then deliveries idle >= redelivery_timeout_s (reclaimed by this consumer), then
    new groups in report order. Each delivery increments the group's delivery_count.
    With ``wait_s`` > 0 and nothing to deliver, the pull waits up to ``wait_s`` seconds and
    delivers as soon as a report queues a group or a pending delivery turns idle: woken (memory:
    an asyncio.Event the queueing sets; Redis: ``XREAD BLOCK`` on the stream), never polled.
    ack(ids): acknowledged groups are deleted and never delivered again.
    release(consumer, deliveries): deliveries this consumer got but could not be sent (an answer
    over the message limit) are handed back: delivery_count as before that delivery, idle at once,
    so the next pull of any consumer delivers them first (before new groups). Never lost.
Run settings (``claim_settings(accept_changes)``, called once by every server at start)
    The settings that decide what the statistics and pools mean (:data:`RUN_SETTINGS`: sampler and
    its parameters, retests, decay, prior, bands, seed) are stored in the namespace (Redis: key
    ``settings``; memory: the snapshot) by the first start. A later start with other values is
    refused with FailedPrecondition naming each changed setting (stored → new) unless
    ``accept_changes`` (``--accept-setting-changes``): then the new values are stored and the
    changes returned (logged). A changed ``seed`` is refused even then: it is part of every
    sorted-set member. A setting the stored set lacks (added by a later version) counts as
    changed only when the new value differs from its default.
Namespace identity (``claim_namespace(accept_loss)``, called by every server at start, before the settings)
    Redis: the namespace carries an identity (key ``identity``, ``"<generation>:<run id>"``,
    :mod:`.identity`), written by the first claim (generation 1) and otherwise only by a deliberate
    reset. A server that claimed one and then finds it gone, older or another run's, or a loss
    marker (key ``lost``) in the namespace, serves nothing: ``namespace_lost`` holds a
    :class:`.identity.NamespaceLost` (FAILED_PRECONDITION: what was lost and how to recover), every
    script refuses to run (the check of ``lua/namespace_check.lua``), health is NOT_SERVING. The
    first server to find the loss writes the marker, so a server started later refuses to start on
    the namespace (FailedPrecondition) unless ``accept_loss`` (``--accept-namespace-loss``): then the
    namespace goes on from what Redis holds, as the next generation with a new run id, and the
    servers still running follow it. When the lost identity comes back (the data restored), the
    marker is deleted and the servers serve again. A newer generation found by a running server
    is such a deliberate reset: followed. Never re-claimed silently: only a claim writes the
    identity, and only a claim with ``accept_loss`` replaces one a marker names.
    Keys it must hold: once a server claimed the namespace and its settings, the namespace must
    hold ``settings`` and ``counters`` (a creation or reset writes both with the identity), and
    every registered problem its statistics (:func:`.identity.missing_keys`); a namespace without
    one is lost the same way (kind ``incomplete``: evicted or deleted), never a script's type error.
    Memory: no identity (``claim_namespace`` returns "", ``namespace_lost`` stays None). Its state
    lives in the server's own process, which no one else can flush or fail over; the snapshot it
    loads at start is the state the operator gives it (an older snapshot is a deliberate restore,
    and the server has no memory of a newer one).
Eviction (``check_eviction()``, called by every server at start, before the claims)
    Redis whose ``maxmemory-policy`` is not ``noeviction`` deletes keys when memory is full: refused
    at start (FailedPrecondition naming the policy and ``CONFIG SET maxmemory-policy noeviction``);
    found later by the health probe, every script and ``stats`` answer StoreUnavailable (kind
    ``evicting``) and health is NOT_SERVING until the policy is ``noeviction`` again. A Redis that
    refuses ``CONFIG GET`` is served, with a warning. Memory: nothing to check.
publish(version, uri): version >= 1; lower than current → FailedPrecondition; equal with another
    uri → FailedPrecondition; equal with the same uri → idempotent.

Clarifications (where the rules above left a choice; both stores follow them)
    Clock: ``sample``, ``report``, ``renew``, ``expire_leases`` and ``pull`` read the clock once, at
        their start, and use that one reading throughout ("now" above). Lease deadlines, every
        comparison against one and tombstone times use one clock per data set: the memory store's
        ``clock`` (one process); Redis's own in the Redis store (``TIME`` in each script; Redis 7
        replicates scripts by their effects), never the replica's, so a lease of T seconds lives T
        seconds by Redis's clock whichever replica leased, renewed, reaped or took its report.
        Determinism: a test may inject a clock into the Redis store (``RedisStore(clock=...)``,
        never a server); its reading then replaces ``TIME``, so the differential tests drive both
        stores with one fake clock. The script computes the deadline ``now + lease_timeout_s`` in
        IEEE doubles, the memory store's sum.
    Leases: due leases expire in (deadline asc, lease id asc) order. A leased problem keeps the
        (source, score) it returns with; ``problem_state``/``dump`` show pool LEASED with that score.
        The lease's step is the step' of the ``sample`` that created it.
    SampledProblem.priority: a heap problem's heap score (an unseen one's ω_unseen while the prior
        is on); a pool problem's ``rules.priority(stats, params)``.
    ``weighted``: a problem taken for a slot leaves the heap at once, so ``|heap|`` and the ranks
        of the next slot count the remaining heap only; H stops when the heap is empty. The
        acceptance test is ``u2 < (priority / 0.25) ** alpha`` in IEEE doubles (C ``pow``).
    Draws: ``weighted`` rank = min(floor(u1·|heap|), |heap| − 1) and ``uniform`` idx =
        min(floor(u·N), N − 1) (the min only guards rounding); ``uniform`` stops when N reaches 0.
    retry_after_s of a short non-empty batch: the same formula, evaluated after the new lease is
        recorded (the earliest deadline over all live leases, the new one included).
    report: ``reward_sum += Σr`` with Σr the group's rewards summed left to right from 0.0 (the
        same sum as in ``rules.update_stats``), added once per group, groups in request order.
        A report for a due but unreaped lease expires that one lease only (problems returned,
        ``lease_expiries`` += 1), then answers "expired" (``late_reports`` += 1).
        "already reported" / "expired" are remembered for 24 h (86,400 s) after the lease ended;
        later the lease is an "unknown lease".
    pull: own pending deliveries and idle ones are taken in group id order (``XREADGROUP 0`` /
        ``XAUTOCLAIM 0-0``); idle = now − time of the last delivery. Every delivery sets the
        delivery time to now and increments delivery_count. ``max_groups`` caps the total.
        The Redis store measures idle time with Redis's own clock (XAUTOCLAIM), not the
        injected one, and its group ids are Redis stream ids; the memory store uses the clock.
        Tombstones older than 24 h are dropped by ``sample`` (both stores).
    ack: only delivered, unacknowledged (pending) groups are acknowledged (deleted,
        ``groups_acked`` += 1); ids of undelivered, unknown or already acknowledged groups are
        counted as unknown and change nothing.
    stats: histogram bucket i counts heap priorities in [edges[i], edges[i+1]), the last bucket
        [edges[b−1], edges[b]], with :func:`histogram_edges` ``(b)``.
    dump: "problems" maps id → (int(pool), n, s1, s2, score) with floats; "counters" has exactly
        groups_mixed, groups_all_correct, groups_all_wrong, groups_constant, forgetting_events,
        breakthroughs, lease_expiries, completions_reported, reward_sum, late_reports,
        groups_acked; "unseen_fit" is the first-visit sums (visits, priority sum); "leases" is the
        sorted list of each live lease's sorted problem ids; "queue" lists the payloads (bytes) of
        groups never delivered, in report order.
"""

from __future__ import annotations

import abc
import math
import time
from collections.abc import Callable, Sequence

from prioreplay import rules
from prioreplay.errors import FailedPrecondition, InvalidArgument
from prioreplay.problems import ProblemRecord, check_name, validate_problem

from ..config import StoreConfig  # noqa: F401  (re-exported: the stores take it from here)
from .contract import (
    EXPIRE_LIMIT,
    MAX_REQUEST_KEY_BYTES,
    conflict_error,
    fixed_changes,
    run_settings,
    same_text,
    setting_changes,
)
from .heap_keys import HeapKeys
from .identity import NamespaceLost
from .pace import LocalPace, pace_refusal, pace_room
from .queue import TrajectoryQueue
from .records import (
    GroupOutcome,
    Lease,
    ProblemState,
    Renewal,
    ReportResult,
    StoreStats,
)


class Store(HeapKeys, TrajectoryQueue, abc.ABC):
    """Problem statistics, pools, leases, the trajectory queue and the policy pointer.

    Public methods validate and delegate to ``_impl`` methods; both implementations share this
    validation, so a bad request fails identically and changes nothing. All methods are
    coroutines. ``clock`` returns unix seconds (injected for deterministic tests).
    """

    #: While the namespace this server claimed is lost (see "Namespace identity"): the error every
    #: RPC answers (FAILED_PRECONDITION); None while it is the claimed one (always, in memory).
    namespace_lost: NamespaceLost | None = None
    #: Times this store found its namespace lost (each change from None to an error), since it was made.
    namespace_losses: int = 0

    def __init__(self, config: StoreConfig, clock: Callable[[], float] = time.time):
        from prioreplay import warm_start

        self.config = config
        self.clock = clock
        #: A new problem's starting statistics from ``config.warm_start``, already shrunk.
        self._warm = {
            pid: warm_start.shrink(st, config.warm_start_shrink)
            for pid, st in (warm_start.read(config.warm_start) if config.warm_start else {}).items()
        }
        HeapKeys.__init__(self, config)  # the heap's scores: priorities, FreshPER keys, the unseen band
        #: The learner's batch and the wake-up of leases waiting on the pace bound (:mod:`.pace`).
        self.pace: LocalPace = LocalPace()

    #: The answer of a sample the pace bound left no room (:func:`.pace.pace_refusal`).
    pace_refusal = staticmethod(pace_refusal)

    def paced_batch(self, batch_size: int, ahead: Callable[[], int]) -> int:
        """B' of "sample" step 1b (:func:`.pace.pace_room`; ``batch_size`` without a bound; < 1: no room)."""
        return pace_room(self.config, batch_size, ahead, self.pace.learner_batch)

    # -- problems -------------------------------------------------------------------------
    async def register(self, problems: Sequence[ProblemRecord], *, replace: bool = True) -> tuple[int, int, int]:
        """Upsert problems by id. Returns (created, updated, total).

        ``replace`` false: refuse ids registered with another prompt or answer (see "register").

        Raises:
            InvalidArgument: a problem with an empty/oversized id, empty prompt or answer, or an
                unknown verifier (the message names its index); with ``replace`` false, ids that
                hold another prompt or answer (:func:`conflict_error`). Nothing of this call is stored.
        """
        for i, p in enumerate(problems):
            validate_problem(p, i)
        dedup: dict[str, ProblemRecord] = {}
        clashes: list[str] = []
        for p in problems:
            if not replace and p.id in dedup and not same_text(dedup[p.id], p):
                clashes.append(p.id)
            dedup[p.id] = p
        if clashes:
            raise conflict_error(clashes)
        if not dedup:
            return 0, 0, await self._count_problems()
        return await self._register(list(dedup.values()), replace)

    async def sample(
        self, batch_size: int, lease_timeout_s: float | None = None, request_id: str = "", worker_id: str = ""
    ) -> Lease:
        """Lease up to ``batch_size`` problems (see the module docstring for the exact rule).

        ``request_id`` (optional, at most 256 bytes) makes a retry safe: while
        the lease a request with this id created is live, the same id gets that lease again
        (same id, problems, deadline and step; nothing changes). See "Retried requests" above.
        ``worker_id`` (optional, at most 128 bytes): the lease's holder, the only one :meth:`renew`
        accepts.

        Raises:
            InvalidArgument: batch_size outside [1, max_batch_size]; lease_timeout_s not a
                finite number in (0, max_lease_timeout_s]; request_id over 256 bytes; worker_id
                over 128 bytes.
        """
        if not (isinstance(batch_size, int) and 1 <= batch_size <= self.config.max_batch_size):
            raise InvalidArgument(
                f"batch_size ({batch_size}) must be in [1, {self.config.max_batch_size}] "
                "(the server's --max-batch-size sets the upper bound)"
            )
        timeout = self._lease_timeout(lease_timeout_s)
        check_name(worker_id, "worker_id")
        if request_id:
            n = len(request_id.encode("utf-8"))
            if n > MAX_REQUEST_KEY_BYTES:
                raise InvalidArgument(
                    f"request_id is {n} bytes; the limit is {MAX_REQUEST_KEY_BYTES}; "
                    "send a short unique id (e.g. 32 hex characters)"
                )
        return await self._sample(batch_size, timeout, request_id=request_id, worker_id=worker_id)

    def _lease_timeout(self, lease_timeout_s: float | None) -> float:
        """The lease length asked for, in seconds (None or 0: the server's ``lease_timeout_s``).

        Raises:
            InvalidArgument: not a finite number in (0, max_lease_timeout_s] (names --max-lease-timeout-s).
        """
        timeout = self.config.lease_timeout_s if lease_timeout_s in (None, 0, 0.0) else lease_timeout_s
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and 0 < timeout <= self.config.max_lease_timeout_s):
            raise InvalidArgument(
                f"lease_timeout_s ({lease_timeout_s}) must be in (0, {self.config.max_lease_timeout_s}] seconds; "
                "0 uses the server default "
                "(the server's --max-lease-timeout-s sets the upper bound)"
            )
        return float(timeout)

    async def renew(self, lease_id: str, worker_id: str = "", lease_timeout_s: float | None = None) -> Renewal:
        """Extend a live lease to now + ``lease_timeout_s`` (see "renew" in the module docstring).

        Raises:
            InvalidArgument: empty lease id; lease_timeout_s not a finite number in
                (0, max_lease_timeout_s] (0 or None: the server default); worker_id over 128 bytes.
            NotFound: the lease is unknown, already reported or expired (named, with the reason).
            FailedPrecondition: the lease was sampled by another worker_id (both named); nothing changes.
        """
        if not lease_id:
            raise InvalidArgument("lease_id is empty; quote the lease_id returned by SampleProblems")
        timeout = self._lease_timeout(lease_timeout_s)
        check_name(worker_id, "worker_id")
        return await self._renew(lease_id, worker_id, timeout)

    async def report(
        self, lease_id: str, outcomes: Sequence[GroupOutcome], more_parts: bool = False, unservable: Sequence[str] = ()
    ) -> ReportResult:
        """Apply a lease's outcomes (see the module docstring); ``more_parts``: one part of a
        report sent in several, the lease stays live for the problems not yet reported.

        ``unservable``: problems of the lease the client could not serve (e.g. a prompt longer than
        its model's context); they are quarantined (see "Quarantine" above) instead of returned.

        Raises:
            InvalidArgument: empty lease id, an empty group, a reward NaN/inf/outside [0, 1],
                a problem id twice in the report (outcomes and unservable together), or a
                problem not in the lease (the lease membership check is the implementation's,
                with the same error). Nothing changes.
        """
        if not lease_id:
            raise InvalidArgument("lease_id is empty; quote the lease_id returned by SampleProblems")
        seen: set[str] = set()
        for i, o in enumerate(outcomes):
            if o.problem_id in seen:
                raise InvalidArgument(f"outcomes[{i}]: problem {o.problem_id!r} is reported twice in one report")
            seen.add(o.problem_id)
            rules.validate_rewards(o.rewards, where=f"outcomes[{i}] (problem {o.problem_id!r}) rewards")
        for i, pid in enumerate(unservable):
            if pid in seen:
                raise InvalidArgument(f"unservable[{i}]: problem {pid!r} is reported twice in one report")
            seen.add(pid)
        return await self._report(lease_id, list(outcomes), unservable=list(unservable), more_parts=bool(more_parts))

    async def claim_namespace(self, accept_loss: bool = False) -> str:
        """Claim the namespace's identity (see "Namespace identity"; before :meth:`claim_settings`).

        Returns:
            A line saying what was claimed, also logged ("" for a store without identities: memory).

        Raises:
            FailedPrecondition: a server found this namespace lost and nothing restored it, and
                ``accept_loss`` is false (the message names the loss and both ways out).
        """
        return ""

    async def check_eviction(self) -> None:  # noqa: B027 -- optional hook: a no-op unless overridden
        """Refuse a store that deletes state on its own (called by every server at start, before the
        claims, and by the Redis store's health probe). Memory: nothing to check.

        Raises:
            FailedPrecondition: Redis's ``maxmemory-policy`` is not ``noeviction`` (named, with the fix).
        """

    async def claim_settings(self, accept_changes: bool = False) -> dict[str, tuple]:
        """Store this run's settings in the namespace, or check them against the stored ones
        (see "Run settings"). Returns the accepted changes ``{name: (old, new)}`` ({} when none).

        Raises:
            FailedPrecondition: the namespace was made with other settings (each named, old → new,
                with the flag ``--accept-setting-changes``), or with another seed (always).
        """
        wanted = run_settings(self.config)
        changes = setting_changes(await self._claim_settings(wanted), wanted)
        listed = ", ".join(f"{name} {old!r} -> {new!r}" for name, (old, new) in changes.items())
        fixed = fixed_changes(changes)
        if fixed:
            raise FailedPrecondition(
                f"this namespace was made with other settings ({listed}); {', '.join(fixed)} cannot change on a "
                "namespace (every key's tie-break depends on the seed, the heap's scores on heap_age_decay and on "
                "whether unseen_prior is off): start with the old value, or use a new --namespace"
            )
        if changes and not accept_changes:
            raise FailedPrecondition(
                f"this namespace was made with other settings ({listed}); its statistics and pools were gathered "
                "with the old ones. Start with the old values, pass --accept-setting-changes to go on with the "
                "new ones, or use a new --namespace"
            )
        if changes:
            await self._put_settings(wanted)
        return changes

    async def expire_leases(self, limit: int = EXPIRE_LIMIT) -> int:
        """Expire up to ``limit`` due leases (oldest deadline first). Returns how many expired."""
        return await self._expire_leases(limit)

    # -- policy ---------------------------------------------------------------------------
    async def publish(self, version: int, weights_uri: str) -> tuple[int, str]:
        """Set the current policy version and weights URI. Returns the (version, uri) now current.

        Raises:
            InvalidArgument: version < 1 or empty uri.
            FailedPrecondition: version lower than the current one, or equal with another uri.
        """
        if not isinstance(version, int) or version < 1:
            raise InvalidArgument(f"version ({version}) must be an integer >= 1")
        if not weights_uri:
            raise InvalidArgument("weights_uri is empty; give the directory holding the safetensors weights")
        return await self._publish(version, weights_uri)

    async def stats(self, histogram_buckets: int = 10) -> StoreStats:
        """Counts and the heap's priority histogram over ``histogram_buckets`` equal buckets."""
        if not (isinstance(histogram_buckets, int) and 1 <= histogram_buckets <= 1000):
            raise InvalidArgument(f"histogram_buckets ({histogram_buckets}) must be in [1, 1000]")
        return await self._stats(histogram_buckets)

    # -- implementation hooks -------------------------------------------------------------
    @abc.abstractmethod
    async def _claim_settings(self, wanted: dict) -> dict:
        """Store ``wanted`` when the namespace has no settings yet (atomically); return the stored ones."""

    @abc.abstractmethod
    async def _put_settings(self, wanted: dict) -> None:
        """Replace the stored settings with ``wanted``."""

    @abc.abstractmethod
    async def _count_problems(self) -> int: ...

    @abc.abstractmethod
    async def _register(self, problems: list[ProblemRecord], replace: bool) -> tuple[int, int, int]:
        """Upsert distinct, valid problems; with ``replace`` false raise :func:`conflict_error`
        (changing nothing) when an id holds another prompt or answer."""

    @abc.abstractmethod
    async def _sample(self, batch_size: int, lease_timeout_s: float, request_id: str = "", worker_id: str = "") -> Lease: ...

    @abc.abstractmethod
    async def _renew(self, lease_id: str, worker_id: str, lease_timeout_s: float) -> Renewal:
        """Extend a live lease of ``worker_id`` (raises :func:`renew_refusal`'s errors otherwise)."""

    @abc.abstractmethod
    async def _report(
        self, lease_id: str, outcomes: list[GroupOutcome], unservable: Sequence[str] = (), more_parts: bool = False
    ) -> ReportResult: ...

    @abc.abstractmethod
    async def _expire_leases(self, limit: int) -> int: ...

    @abc.abstractmethod
    async def _publish(self, version: int, weights_uri: str) -> tuple[int, str]: ...

    @abc.abstractmethod
    async def _stats(self, histogram_buckets: int) -> StoreStats: ...

    @abc.abstractmethod
    async def policy(self) -> tuple[int, str]:
        """The current (policy_version, weights_uri); (0, "") before the first publish."""

    @abc.abstractmethod
    async def problem_state(self, problem_id: str) -> ProblemState:
        """A problem's state. Raises NotFound naming the id."""

    @abc.abstractmethod
    async def dump(self) -> dict:
        """Canonical state for the differential test: {"problems": {id: (pool, n, s1, s2, score)},
        "counters": {...}, "step": int, "policy": (version, uri), "leases": sorted lease problem
        id lists, "queue": [payload, ...] undelivered in order}."""

    async def snapshot(self) -> None:  # noqa: B027 -- optional hook: a no-op unless overridden
        """Persist state if the store keeps it in process (memory: atomic file write). No-op for Redis."""

    async def healthy(self) -> bool:
        """True when the store can serve requests (Redis: answers PING)."""
        return True

    async def close(self) -> None:  # noqa: B027 -- optional hook: a no-op unless overridden
        """Release connections; the memory store also writes its snapshot."""
