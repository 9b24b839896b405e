"""The in-process ``memory`` store: the same semantics as the Redis store, kept in sorted containers.

It is the embedded default for one machine (no server to install) and the oracle of the
differential test against ``redis``; the semantics are the module docstring of
:mod:`prioreplay.priority_server.store`, followed literally (orders, tie-breaks, RNG draws,
floating-point operation order).

Data structures (N problems, B problems per batch):

* heap: a ``SortedList`` of ``(priority, member)`` ascending; heap order (priority desc, member
  desc) is read from its end, so the top-k and the k-th in heap order cost O(log N); with
  ``--unseen-prior`` on, unseen problems sit at its bottom, score −1 (:class:`.memory_view.MemorySamplerView`).
* solved / unsolved pools: ``SortedList`` of ``(last tested step, member)`` ascending (pool order);
  with ``retest_versions`` the policy version of the last test instead of the step
  (:func:`prioreplay.rules.pool_score`).
* leases: a dict by lease id plus a ``SortedList`` of ``(deadline, lease id)``; ended leases leave a
  tombstone ("already reported" / "expired") for 24 h.
* trajectory queue: Redis-stream semantics with one consumer group: groups never delivered in
  report order, and pending (delivered, unacknowledged) groups by id with their consumer, last
  delivery time and delivery count.

``sample`` and ``report`` therefore cost O(B log N). The store is used from one asyncio event
loop; every method validates its whole input before the first mutation, so a method that raises
leaves the state as it was. The records (problems, leases, tombstones, the queue, counters) are a
:class:`~.snapshot.MemoryState`; the containers above are indexes derived from them. Each
record also keeps its serialized ``Problem`` (``Entry.wire``, built when registered or restored;
about the record's size again), which SampleProblems copies into its answer.
``snapshot()`` writes the records with :mod:`.snapshot` (JSON, atomic replace); the constructor
restores them and refuses a corrupt snapshot. Sampling runs the configured sampler of
:mod:`.samplers` over a view of the heap and the pools.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path

from sortedcontainers import SortedDict, SortedList

from prioreplay import rules, unseen_prior
from prioreplay.convert import problem_bytes
from prioreplay.errors import FailedPrecondition, InvalidArgument, NotFound
from prioreplay.problems import ProblemRecord
from prioreplay.rules import GroupKind, Pool, Stats

from ..config import StoreConfig
from ..samplers import SAMPLERS, Pick, SampleRequest, XorShift32, retest_quota, step_seed
from . import snapshot
from .base import Store
from .contract import (
    EXPIRE_LIMIT,
    TOMBSTONE_TTL_S,
    add_unseen,
    conflict_error,
    histogram_edges,
    member_id,
    queues_group,
    renew_refusal,
    same_text,
    tie_member,
)
from .memory_queue import MemoryTrajectoryQueue
from .memory_view import MemorySamplerView
from .records import (
    GroupOutcome,
    Lease,
    ProblemState,
    Renewal,
    ReportResult,
    SampledProblem,
    StoreStats,
)
from .snapshot import COUNTER_NAMES, Entry, LeaseRecord, MemoryState

#: The counter each group kind increments (report.lua: 'groups_' .. kind).
_KIND_COUNTER = {kind: f"groups_{kind.value}" for kind in GroupKind}


class MemoryStore(MemoryTrajectoryQueue, Store):
    """The in-process store (see the module docstrings here and in ``store.py``).

    Args:
        config: sampling and bookkeeping parameters.
        snapshot_path: JSON file the state is restored from (when it exists) and written to by
            ``snapshot()`` / ``close()``; None keeps the state in memory only.
        clock: returns unix seconds (injected for deterministic tests).

    Raises:
        InvalidArgument: the snapshot file exists but cannot be read or is corrupt (the message
            names the path); the store never starts empty in its place.
    """

    def __init__(self, config: StoreConfig, snapshot_path: Path | None = None, clock: Callable[[], float] = time.time):
        super().__init__(config, clock)
        self.snapshot_path = Path(snapshot_path) if snapshot_path is not None else None
        self._sampler = SAMPLERS[config.sampler]
        self._sample_impl = self._sampler.memory(config, config.sampler_params)
        self._bands = config.bands
        #: Set (and replaced) by a queued or released group while pulls wait on it (:attr:`_waiting`).
        self._queued = asyncio.Event()
        self._waiting = 0
        state = MemoryState()
        if self.snapshot_path is not None and self.snapshot_path.exists():
            state = snapshot.read(self.snapshot_path, lambda pid: tie_member(pid, config.seed))
        self._adopt(state)

    def _adopt(self, state: MemoryState) -> None:
        """Take ``state`` as the records and derive the indexes from them."""
        self._s = state
        self._heap: SortedList = SortedList()  # (priority, member)
        self._pools: dict[Pool, SortedList] = {Pool.SOLVED: SortedList(), Pool.UNSOLVED: SortedList()}
        for e in state.problems.values():
            e.wire = problem_bytes(e.record)
            if e.pool not in (Pool.LEASED, Pool.QUARANTINED):
                self._container(e.pool).add((e.score, e.member))
        self._quarantined = {pid for pid, e in state.problems.items() if e.pool is Pool.QUARANTINED}
        self._deadlines = SortedList((lz.deadline, lz.lease_id) for lz in state.leases.values())
        state.pending = SortedDict(state.pending)  # key -> QueuedGroup, in group id order
        self._by_consumer: dict[str, SortedList] = {}  # consumer -> keys of its pending groups
        self._parts: dict[str, set[str]] = {}  # lease id -> problems applied by earlier parts (live leases)
        for key, g in state.pending.items():
            self._by_consumer.setdefault(g.consumer, SortedList()).add(key)
        self._view = MemorySamplerView(self._heap, self._pools, state.problems, state.tokens)
        # request id -> (lease id, its deadline, problem id -> group_size as sampled)
        self._requests: dict[str, tuple[str, float, dict[str, int | None]]] = {}
        self._request_deadlines: SortedList = SortedList()  # (deadline, request id)
        self._request_of: dict[str, str] = {}  # lease id -> the request id that made it (while remembered)
        # problems with statistics, n > 0 (an accepted report or a warm start gave them; derived, not snapshotted)
        self._seen = sum(1 for e in state.problems.values() if e.stats.n > 0)

    # -- placement helpers ----------------------------------------------------------------
    def _container(self, pool: Pool) -> SortedList:
        return self._heap if pool is Pool.HEAP else self._pools[pool]

    def _place(self, e: Entry, pool: Pool, score: float) -> None:
        """Put a problem that is nowhere (new or leased) into ``pool`` with ``score``."""
        e.pool = pool
        e.home = pool
        e.score = score
        self._container(pool).add((score, e.member))

    def _lease_pick(self, pick: Pick) -> SampledProblem:
        """Move a problem a sampler took (already out of its container) to LEASED."""
        e = self._entry(pick.member)
        e.home = pick.source
        e.pool = Pool.LEASED
        prio = self.leased_priority(pick.source, e.score, e.stats, self._s.policy[0], self._view.unseen or 0.0)
        return SampledProblem(problem=e.record, priority=prio, source=pick.source, group_size=pick.group_size, wire=e.wire)

    def _entry(self, member: str) -> Entry:
        return self._s.problems[member_id(member)]

    # -- leases ---------------------------------------------------------------------------
    def _end_lease(self, lease: LeaseRecord, reason: str, now: float) -> None:
        del self._s.leases[lease.lease_id]
        self._parts.pop(lease.lease_id, None)
        self._request_of.pop(lease.lease_id, None)
        self._deadlines.remove((lease.deadline, lease.lease_id))
        self._s.tombstones[lease.lease_id] = (reason, now)

    def _return_problems(self, lease: LeaseRecord, skip: AbstractSet[str] = frozenset()) -> None:
        for pid in lease.problem_ids:
            if pid not in skip:
                e = self._s.problems[pid]
                self._place(e, e.home, e.score)

    def _expire_one(self, lease: LeaseRecord, now: float) -> None:
        self._return_problems(lease)
        self._end_lease(lease, "expired", now)
        self._s.counters["lease_expiries"] += 1

    def _expire_due(self, now: float, limit: int) -> int:
        n = 0
        while n < limit and self._deadlines and self._deadlines[0][0] <= now:
            self._expire_one(self._s.leases[self._deadlines[0][1]], now)
            n += 1
        return n

    def _prune_tombstones(self, now: float) -> None:
        horizon = now - TOMBSTONE_TTL_S
        tombstones = self._s.tombstones
        while tombstones:
            lease_id, (_, ended) = next(iter(tombstones.items()))
            if ended >= horizon:
                return
            del tombstones[lease_id]

    def _retry_after(self, now: float) -> float:
        """max(0.05, min(5, earliest live lease deadline − now)), or 1.0 with no lease (seconds)."""
        if not self._deadlines:
            return 1.0
        return max(0.05, min(5.0, self._deadlines[0][0] - now))

    # -- run settings ---------------------------------------------------------------------
    async def _claim_settings(self, wanted: dict) -> dict:
        if self._s.settings is None:
            self._s.settings = dict(wanted)
        return self._s.settings

    async def _put_settings(self, wanted: dict) -> None:
        self._s.settings = dict(wanted)

    # -- problems -------------------------------------------------------------------------
    async def _count_problems(self) -> int:
        return len(self._s.problems)

    async def _register(self, problems: list[ProblemRecord], replace: bool) -> tuple[int, int, int]:
        updated = 0
        added: list[tuple[float, str]] = []
        known = self._s.problems
        if not replace:
            clashes = [p.id for p in problems if p.id in known and not same_text(known[p.id].record, p)]
            if clashes:
                raise conflict_error(clashes)
        for p in problems:
            e = known.get(p.id)
            if e is not None:
                e.record = p
                e.wire = problem_bytes(p)
                updated += 1
                if e.pool is Pool.QUARANTINED:  # registered again: back where it came from
                    self._quarantined.discard(p.id)
                    self._place(e, e.home, e.score)
                continue
            st = self._warm.get(p.id, Stats())  # prioreplay/warm_start.py: in the heap at its shrunk statistics
            score = self.registered_score(st)
            e = Entry(p, tie_member(p.id, self.config.seed), st, Pool.HEAP, Pool.HEAP, score, problem_bytes(p))
            known[p.id] = e
            self._seen += st.n > 0  # seen = statistics n > 0: a warm start's count too (docs/METHOD.md)
            added.append((score, e.member))
        self._heap.update(added)  # one sort + merge: O(k log k + N) for k new problems
        return len(added), updated, len(known)

    async def _sample(self, batch_size: int, lease_timeout_s: float, request_id: str = "", worker_id: str = "") -> Lease:
        now = self.clock()
        cfg = self.config
        if request_id:
            replay = self._replay(request_id, batch_size, now)
            if replay is not None:
                return replay
            self._prune_requests(now)
        self._expire_due(now, EXPIRE_LIMIT)
        self._prune_tombstones(now)
        room = self.paced_batch(batch_size, lambda: len(self._s.new) + sum(len(z.problem_ids) for z in self._s.leases.values()))
        if room < 1:  # the pace bound leaves no room (base.py, "sample" 1b)
            return self.pace_refusal(*self._s.policy, self._s.step, self._deadlines[0][0] - now if self._deadlines else math.inf)
        step1 = self._s.step + 1
        request = SampleRequest(
            batch_size=room,
            step=step1,
            retest_interval=cfg.retest_versions or cfg.retest_interval,
            quota=retest_quota(room, cfg.retest_fraction, step1) if self._sampler.retests else 0,
            rng=XorShift32(step_seed(cfg.seed, step1)) if self._sampler.uses_rng else None,
            pool_clock=self._s.policy[0] if cfg.retest_versions else None,
        )
        self._view.unseen = self.unseen_priority(self._s.unseen_fit) if self.unseen_band else None
        batch = [self._lease_pick(pick) for pick in self._sample_impl.sample(self._view, request)]
        version, uri = self._s.policy
        if not batch:
            return Lease("", 0.0, [], version, uri, self._retry_after(now), self._s.step)
        self._s.step = step1
        lease = LeaseRecord(secrets.token_hex(16), now + lease_timeout_s, step1, [sp.problem.id for sp in batch], worker_id)
        self._s.leases[lease.lease_id] = lease
        self._deadlines.add((lease.deadline, lease.lease_id))
        retry = self._retry_after(now) if len(batch) < batch_size else 0.0
        if request_id:
            self._requests[request_id] = (lease.lease_id, lease.deadline, {sp.problem.id: sp.group_size for sp in batch})
            self._request_deadlines.add((lease.deadline, request_id))
            self._request_of[lease.lease_id] = request_id
        return Lease(lease.lease_id, lease.deadline, batch, version, uri, retry, step1)

    def _replay(self, request_id: str, batch_size: int, now: float) -> Lease | None:
        """The live lease an earlier sample with ``request_id`` made, as that sample returned it; else None."""
        seen = self._requests.get(request_id)
        lease = self._s.leases.get(seen[0]) if seen is not None else None
        if lease is None or lease.deadline <= now:
            return None
        batch, unseen = [], self.unseen_priority(self._s.unseen_fit)
        for pid in lease.problem_ids:
            e = self._s.problems[pid]
            prio = self.leased_priority(e.home, e.score, e.stats, self._s.policy[0], unseen)
            batch.append(SampledProblem(problem=e.record, priority=prio, source=e.home, group_size=seen[2].get(pid), wire=e.wire))  # type: ignore[index]  # not None: the branch above returned
        version, uri = self._s.policy
        retry = self._retry_after(now) if len(batch) < batch_size else 0.0
        return Lease(lease.lease_id, lease.deadline, batch, version, uri, retry, lease.step)

    def _prune_requests(self, now: float) -> None:
        """Forget request ids whose lease deadline has passed (their lease is no longer live)."""
        due = self._request_deadlines
        while due and due[0][0] <= now:
            deadline, rid = due.pop(0)
            if self._requests.get(rid, ("", None, None))[1] == deadline:  # else: renewed, due later
                lease_id = self._requests.pop(rid)[0]
                self._request_of.pop(lease_id, None)

    async def _renew(self, lease_id: str, worker_id: str, lease_timeout_s: float) -> Renewal:
        now = self.clock()
        lease = self._s.leases.get(lease_id)
        if lease is None:
            tomb = self._s.tombstones.get(lease_id)
            raise renew_refusal(lease_id, tomb[0] if tomb else "unknown lease")
        if lease.deadline <= now:
            self._expire_one(lease, now)
            raise renew_refusal(lease_id, "expired")
        if lease.worker_id != worker_id:
            raise renew_refusal(lease_id, "another worker", worker_id, lease.worker_id)
        self._deadlines.remove((lease.deadline, lease_id))
        lease.deadline = now + lease_timeout_s
        self._deadlines.add((lease.deadline, lease_id))
        rid = self._request_of.get(lease_id)
        seen = self._requests.get(rid) if rid is not None else None
        if rid is not None and seen is not None and seen[0] == lease_id:
            # a retry of the sample that made it still gets it until the new deadline
            self._requests[rid] = (lease_id, lease.deadline, seen[2])
            self._request_deadlines.add((lease.deadline, rid))
        return Renewal(lease.deadline, len(lease.problem_ids))

    async def _report(
        self, lease_id: str, outcomes: list[GroupOutcome], unservable: Sequence[str] = (), more_parts: bool = False
    ) -> ReportResult:
        now = self.clock()
        c = self._s.counters
        lease = self._s.leases.get(lease_id)
        if lease is None:
            tomb = self._s.tombstones.get(lease_id)
            c["late_reports"] += 1
            return ReportResult(False, tomb[0] if tomb else "unknown lease")
        if lease.deadline <= now:
            self._expire_one(lease, now)
            c["late_reports"] += 1
            return ReportResult(False, "expired")
        members = set(lease.problem_ids)
        done = self._parts.get(lease_id, set())
        fresh = []
        for i, o in enumerate(outcomes):
            if o.problem_id in members:
                fresh.append(o)
            elif o.problem_id not in done:
                raise InvalidArgument(
                    f"outcomes[{i}]: problem {o.problem_id!r} is not in lease {lease_id!r}; "
                    "report only the problems that lease returned"
                )
        for i, pid in enumerate(unservable):
            if pid not in members:
                raise InvalidArgument(
                    f"unservable[{i}]: problem {pid!r} is not in lease {lease_id!r}; report only the problems that lease returned"
                )
        # Validated: from here on nothing raises.
        kinds = [self._apply_group(o, lease.step, now) for o in fresh]
        applied = iter(kinds)  # every outcome's kind, in report order (outcomes of earlier parts: classified only)
        all_kinds = tuple(next(applied) if o.problem_id in members else rules.classify(o.rewards) for o in outcomes)
        for pid in unservable:  # keeps (home, score) to return to when registered again
            self._s.problems[pid].pool = Pool.QUARANTINED
            self._quarantined.add(pid)
        reported = {o.problem_id for o in fresh} | set(unservable)
        rest = [p for p in lease.problem_ids if p not in reported]
        if more_parts and rest:  # a part: the lease stays live for the rest
            lease.problem_ids = rest
            self._parts[lease_id] = done | reported
        else:
            if not more_parts:
                self._return_problems(lease, skip=reported)
            self._end_lease(lease, "already reported", now)
        zv = self.config.queue_zero_variance
        return ReportResult(
            True,
            "",
            sum(queues_group(k, zv) and bool(o.payload) for k, o in zip(kinds, fresh, strict=True)),
            sum(not queues_group(k, zv) for k in kinds),
            skipped=len(outcomes) - len(fresh),
            quarantined=len(unservable),
            kinds=all_kinds,
        )

    def _apply_group(self, o: GroupOutcome, lease_step: int, now: float) -> GroupKind:
        """One reported group: statistics, place, counters, and the queue (:func:`.contract.queues_group`) when it
        has a payload (an empty payload: a rewards-only client, nothing to learn from). Returns its kind.

        The group's sums, kind and verdict are computed once and shared by every rule below (the
        hot path of ReportOutcomes; ``rules.update_stats`` / ``is_forgetting`` / ``is_breakthrough``
        give the same values from the rewards)."""
        cfg, c, e = self.config, self._s.counters, self._s.problems[o.problem_id]
        params = cfg.params
        rewards = o.rewards
        g = len(rewards)
        sr, sq = rules.reward_sums(rewards)
        source = e.home
        kind = rules.classify(rewards)
        first = e.stats.n == 0
        self._seen += first
        run = self._s.evidence.get(o.problem_id, (0, 0, version := self._s.policy[0]))  # (streak pool, streak, last version)
        lam = rules.aged_decay(params.decay, cfg.age_decay, max(0, version - run[2]))
        e.stats = rules.fold_sums(e.stats, lam, g, sr, sq)
        if first:  # a first visit: the prior for unseen problems is fitted to these (prioreplay/unseen_prior.py)
            self._s.unseen_fit = unseen_prior.observe(self._s.unseen_fit, g, rules.priority(e.stats, params))
        if o.completion_tokens > 0:  # the token mean decays like the statistics, by λ per report (lua/report.lua)
            tn, tt = self._s.tokens.get(o.problem_id, (0.0, 0.0))
            self._s.tokens[o.problem_id] = (params.decay * tn + g, params.decay * tt + o.completion_tokens)
        k = rules.evidence_groups(g, cfg.pool_evidence)
        verdict = rules.destination(kind, sr / g, self._bands)
        dest, heap_score, streak_pool, streak = rules.place_group(verdict, run[0], run[1], k, e.stats, params)
        self._s.evidence[o.problem_id] = (streak_pool, streak, version)
        pool_at = rules.pool_score(lease_step, version, cfg.retest_versions)
        self._place(e, dest, pool_at if heap_score is None else self.heap_score(heap_score, version))
        c[_KIND_COUNTER[kind]] += 1  # report.lua: 'groups_' .. kind
        c["completions_reported"] += g
        c["reward_sum"] = c["reward_sum"] + sr
        event = rules.retest_event(source, verdict)
        if event is not None:
            c["forgetting_events" if event == "forgetting" else "breakthroughs"] += 1
        if o.payload and queues_group(kind, cfg.queue_zero_variance):
            self._enqueue(o.payload, now)
        return kind

    async def _expire_leases(self, limit: int) -> int:
        return self._expire_due(self.clock(), limit)

    # -- policy and introspection ---------------------------------------------------------
    async def _publish(self, version: int, weights_uri: str) -> tuple[int, str]:
        cur_version, cur_uri = self._s.policy
        if version < cur_version:
            raise FailedPrecondition(
                f"policy version {version} is older than the current version {cur_version}; versions never go backwards"
            )
        if version == cur_version and weights_uri != cur_uri:
            raise FailedPrecondition(
                f"policy version {version} is already published with weights_uri {cur_uri!r}; "
                f"publish a higher version for {weights_uri!r}"
            )
        self._s.policy = (version, weights_uri)
        return self._s.policy

    async def policy(self) -> tuple[int, str]:
        return self._s.policy

    async def _stats(self, histogram_buckets: int) -> StoreStats:
        edges = histogram_edges(histogram_buckets)
        keys = [self.heap_score(edge, self._s.policy[0]) for edge in edges]  # the edges as heap scores now
        # bucket i: edges[i] <= p < edges[i+1]; the last bucket includes edges[-1] (0.25)
        cuts = [self._heap.bisect_left((edge,)) for edge in keys[:-1]] + [self._heap.bisect_right((keys[-1], "\U0010ffff"))]
        # (edge,) sorts before every (edge, member): bisect_left counts priorities < edge;
        # members are ASCII hex + id, so (0.25, max char) sorts after every (0.25, member).
        hist = [cuts[i + 1] - cuts[i] for i in range(histogram_buckets)]  # the unseen band (score −1) in no bucket
        s, unseen = self._s, self.unseen_priority(self._s.unseen_fit)
        if self.unseen_band:
            hist = add_unseen(hist, edges, self._view.unseen_in_heap(), unseen)
        leased = sum(len(lease.problem_ids) for lease in s.leases.values())
        return StoreStats(
            problems=len(s.problems),
            heap_size=len(self._heap),
            solved=len(self._pools[Pool.SOLVED]),
            unsolved=len(self._pools[Pool.UNSOLVED]),
            leased=leased,
            active_leases=len(s.leases),
            quarantined=len(self._quarantined),
            step=s.step,
            policy_version=s.policy[0],
            weights_uri=s.policy[1],
            priority_histogram=hist,
            priority_bucket_edges=edges,
            queue_depth=len(s.new),
            pending_groups=len(s.pending),
            unseen=len(s.problems) - self._seen,
            unseen_priority=unseen,
            **{name: s.counters[name] for name in COUNTER_NAMES},  # type: ignore[arg-type]  # the keyword dict holds exactly the callee's fields
        )

    async def problem_state(self, problem_id: str) -> ProblemState:
        e = self._s.problems.get(problem_id)
        if e is None:
            raise NotFound(f"problem {problem_id!r} is not registered; register it first (RegisterProblems)")
        return ProblemState(
            problem=e.record, stats=e.stats, pool=e.pool, score=e.score, priority=rules.priority(e.stats, self.config.params)
        )

    async def dump(self) -> dict:
        s = self._s
        return {
            "problems": {pid: (int(e.pool), e.stats.n, e.stats.s1, e.stats.s2, e.score) for pid, e in s.problems.items()},
            "counters": dict(s.counters),
            "step": s.step,
            "policy": s.policy,
            "leases": sorted(sorted(lease.problem_ids) for lease in s.leases.values()),
            "queue": [g.payload for g in s.new.values()],
            "evidence": dict(sorted(s.evidence.items())),
            "unseen_fit": (s.unseen_fit.visits, s.unseen_fit.priority_sum),
        }

    # -- persistence ----------------------------------------------------------------------
    async def snapshot(self) -> None:
        """Write the state to ``snapshot_path`` atomically (:func:`.snapshot.write_atomic`).

        The state is copied on the event loop (consistent), then encoded and written in a
        worker thread. No-op without a snapshot path.

        Raises:
            OSError: the directory is not writable (the previous snapshot stays intact).
        """
        if self.snapshot_path is None:
            return
        doc = snapshot.encode(self._s)
        await asyncio.to_thread(snapshot.write_atomic, self.snapshot_path, doc)

    async def close(self) -> None:
        """Write the snapshot (when a path is set)."""
        await self.snapshot()
