"""The in-process ``memory`` store: the same semantics as the Redis store, kept in sorted containers.

It is the embedded default for one machine (no server to install) and the oracle of the
differential test against ``redis``; the semantics are the module docstring of
:mod:`prioreplay.priority_server.store`, followed literally (orders, tie-breaks, RNG draws,
floating-point operation order).

Data structures (N problems, B problems per batch):

* heap: a ``SortedList`` of ``(priority, member)`` ascending; heap order (priority desc, member
  desc) is read from its end, so the top-k and the k-th in heap order cost O(log N).
* solved / unsolved pools: ``SortedList`` of ``(last tested step, member)`` ascending (pool order).
* leases: a dict by lease id plus a ``SortedList`` of ``(deadline, lease id)``; ended leases leave a
  tombstone ("already reported" / "expired") for 24 h.
* trajectory queue: Redis-stream semantics with one consumer group: groups never delivered in
  report order, and pending (delivered, unacknowledged) groups by id with their consumer, last
  delivery time and delivery count.

``sample`` and ``report`` therefore cost O(B log N). The store is used from one asyncio event
loop; every method validates its whole input before the first mutation, so a method that raises
leaves the state as it was. ``snapshot()`` writes the whole state as JSON (payloads base64) with an
atomic replace; the constructor restores it and refuses a corrupt snapshot.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import math
import os
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from sortedcontainers import SortedDict, SortedList

from prioreplay.errors import FailedPrecondition, InvalidArgument, NotFound
from prioreplay.priority_server import rules
from prioreplay.priority_server.rules import GroupKind, Pool, Stats
from prioreplay.priority_server.store import (
    EXPIRE_LIMIT,
    Delivery,
    GroupOutcome,
    Lease,
    ProblemRecord,
    ProblemState,
    ReportResult,
    SampledProblem,
    Store,
    StoreConfig,
    StoreStats,
    TOMBSTONE_TTL_S,
)


#: Snapshot format tag and version; a file with another tag or version is refused.
SNAPSHOT_FORMAT = "prioreplay-memory-store"
SNAPSHOT_VERSION = 1

#: The counters of ``StoreStats`` / ``dump()["counters"]`` that the store accumulates.
COUNTER_NAMES = (
    "groups_mixed",
    "groups_all_correct",
    "groups_all_wrong",
    "groups_constant",
    "forgetting_events",
    "breakthroughs",
    "lease_expiries",
    "completions_reported",
    "reward_sum",
    "late_reports",
    "groups_acked",
)

_KIND_COUNTER = {
    GroupKind.MIXED: "groups_mixed",
    GroupKind.ALL_CORRECT: "groups_all_correct",
    GroupKind.ALL_WRONG: "groups_all_wrong",
    GroupKind.CONSTANT: "groups_constant",
}

# Solved before unsolved when two pooled problems have the same score (store.py, sample step 3).
_POOL_RANK = {Pool.SOLVED: 0, Pool.UNSOLVED: 1}


@dataclass(slots=True)
class _Entry:
    """A problem's mutable state.

    ``pool`` is where it is now (LEASED while out); ``home`` and ``score`` are where it returns
    to and with which score (equal to pool/score while not leased).
    """

    record: ProblemRecord
    member: str
    stats: Stats
    pool: Pool
    home: Pool
    score: float


@dataclass(slots=True)
class _LeaseRec:
    lease_id: str
    deadline: float  # unix seconds
    step: int  # the step' of the sample that created it
    problem_ids: list[str]  # batch order


@dataclass(slots=True)
class _Group:
    """A queued trajectory group (a stream entry); ``consumer`` is "" until first delivered."""

    key: tuple[int, int]  # (ms, seq) of the id "ms-seq"
    payload: bytes
    delivery_count: int = 0
    consumer: str = ""
    delivered_at: float = 0.0  # unix seconds of the last delivery


def _group_id(key: tuple[int, int]) -> str:
    return f"{key[0]}-{key[1]}"


def _parse_group_id(group_id: str) -> tuple[int, int] | None:
    """(ms, seq) of a stream-style id "ms-seq", or None when it is not one."""
    ms, sep, seq = group_id.partition("-")
    if not sep or not ms.isdigit() or not seq.isdigit():
        return None
    return int(ms), int(seq)


class MemoryStore(Store):
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

    def __init__(self, config: StoreConfig, snapshot_path: Path | None = None,
                 clock: Callable[[], float] = time.time):
        super().__init__(config, clock)
        self.snapshot_path = Path(snapshot_path) if snapshot_path is not None else None
        self._problems: dict[str, _Entry] = {}
        self._heap: SortedList = SortedList()  # (priority, member)
        self._pools: dict[Pool, SortedList] = {Pool.SOLVED: SortedList(), Pool.UNSOLVED: SortedList()}
        self._leases: dict[str, _LeaseRec] = {}
        self._deadlines: SortedList = SortedList()  # (deadline, lease_id)
        self._tombstones: collections.OrderedDict[str, tuple[str, float]] = collections.OrderedDict()
        self._new: collections.OrderedDict[tuple[int, int], _Group] = collections.OrderedDict()
        self._pending: SortedDict = SortedDict()  # key -> _Group
        self._by_consumer: dict[str, SortedList] = {}  # consumer -> keys of its pending groups
        self._last_key: tuple[int, int] = (0, 0)
        self._counters: dict[str, float | int] = {name: 0 for name in COUNTER_NAMES}
        self._counters["reward_sum"] = 0.0
        self._step = 0
        self._policy: tuple[int, str] = (0, "")
        if self.snapshot_path is not None and self.snapshot_path.exists():
            self._restore(self.snapshot_path)

    # -- placement helpers ----------------------------------------------------------------
    def _container(self, pool: Pool) -> SortedList:
        return self._heap if pool is Pool.HEAP else self._pools[pool]

    def _place(self, e: _Entry, pool: Pool, score: float) -> None:
        """Put a problem that is nowhere (new or leased) into ``pool`` with ``score``."""
        e.pool = pool
        e.home = pool
        e.score = score
        self._container(pool).add((score, e.member))

    def _take(self, e: _Entry) -> SampledProblem:
        """Move a problem already removed from its container to LEASED; it remembers its home."""
        source = e.pool
        e.home = source
        e.pool = Pool.LEASED
        prio = e.score if source is Pool.HEAP else rules.priority(e.stats, self.config.params)
        return SampledProblem(problem=e.record, priority=prio, source=source)

    def _entry(self, member: str) -> _Entry:
        return self._problems[rules.member_id(member)]

    def _pool_head(self) -> tuple[Pool, tuple[float, str]] | None:
        """First problem in merged pool order (score asc, solved before unsolved, member asc)."""
        best: tuple[Pool, tuple[float, str]] | None = None
        for pool in (Pool.SOLVED, Pool.UNSOLVED):
            sl = self._pools[pool]
            if sl:
                item = sl[0]
                if best is None or (item[0], _POOL_RANK[pool], item[1]) < (best[1][0], _POOL_RANK[best[0]], best[1][1]):
                    best = (pool, item)
        return best

    def _take_from_pools(self, count: int, max_score: float | None, out: list[SampledProblem]) -> None:
        """Lease up to ``count`` pooled problems in merged pool order, with score <= max_score."""
        taken = 0
        while taken < count:
            head = self._pool_head()
            if head is None or (max_score is not None and head[1][0] > max_score):
                return
            pool, item = head
            self._pools[pool].pop(0)
            out.append(self._take(self._entry(item[1])))
            taken += 1

    # -- leases ---------------------------------------------------------------------------
    def _end_lease(self, lease: _LeaseRec, reason: str, now: float) -> None:
        del self._leases[lease.lease_id]
        self._deadlines.remove((lease.deadline, lease.lease_id))
        self._tombstones[lease.lease_id] = (reason, now)

    def _return_problems(self, lease: _LeaseRec, skip: set[str] = frozenset()) -> None:
        for pid in lease.problem_ids:
            if pid not in skip:
                e = self._problems[pid]
                self._place(e, e.home, e.score)

    def _expire_one(self, lease: _LeaseRec, now: float) -> None:
        self._return_problems(lease)
        self._end_lease(lease, "expired", now)
        self._counters["lease_expiries"] += 1

    def _expire_due(self, now: float, limit: int) -> int:
        n = 0
        while n < limit and self._deadlines and self._deadlines[0][0] <= now:
            self._expire_one(self._leases[self._deadlines[0][1]], now)
            n += 1
        return n

    def _prune_tombstones(self, now: float) -> None:
        horizon = now - TOMBSTONE_TTL_S
        while self._tombstones:
            lease_id, (_, ended) = next(iter(self._tombstones.items()))
            if ended >= horizon:
                return
            del self._tombstones[lease_id]

    def _retry_after(self, now: float) -> float:
        """max(0.05, min(5, earliest live lease deadline − now)), or 1.0 with no lease (seconds)."""
        if not self._deadlines:
            return 1.0
        return max(0.05, min(5.0, self._deadlines[0][0] - now))

    # -- problems -------------------------------------------------------------------------
    async def _count_problems(self) -> int:
        return len(self._problems)

    async def _register(self, problems: list[ProblemRecord]) -> tuple[int, int, int]:
        updated = 0
        initial = rules.priority(Stats(), self.config.params)
        added: list[tuple[float, str]] = []
        for p in problems:
            e = self._problems.get(p.id)
            if e is not None:
                e.record = p
                updated += 1
                continue
            e = _Entry(record=p, member=rules.tie_member(p.id, self.config.seed), stats=Stats(),
                       pool=Pool.HEAP, home=Pool.HEAP, score=initial)
            self._problems[p.id] = e
            added.append((initial, e.member))
        self._heap.update(added)  # one sort + merge: O(k log k + N) for k new problems
        return len(added), updated, len(self._problems)

    async def _sample(self, batch_size: int, lease_timeout_s: float) -> Lease:
        now = self.clock()
        cfg = self.config
        self._expire_due(now, EXPIRE_LIMIT)
        self._prune_tombstones(now)
        step1 = self._step + 1
        rng = rules.XorShift32(rules.step_seed(cfg.seed, step1))
        batch: list[SampledProblem] = []
        if cfg.sampler == "uniform":
            self._sample_uniform(batch_size, rng, batch)
        else:
            quota = rules.retest_quota(batch_size, cfg.retest_fraction)
            self._take_from_pools(quota, float(step1 - cfg.retest_interval), batch)  # R
            if cfg.sampler == "heap":
                self._sample_heap_top(batch_size - len(batch), batch)  # H
            else:
                self._sample_weighted(batch_size - len(batch), rng, batch)  # H
            self._take_from_pools(batch_size - len(batch), None, batch)  # F
        version, uri = self._policy
        if not batch:
            return Lease("", 0.0, [], version, uri, self._retry_after(now), self._step)
        self._step = step1
        lease = _LeaseRec(secrets.token_hex(16), now + lease_timeout_s, step1, [sp.problem.id for sp in batch])
        self._leases[lease.lease_id] = lease
        self._deadlines.add((lease.deadline, lease.lease_id))
        retry = self._retry_after(now) if len(batch) < batch_size else 0.0
        return Lease(lease.lease_id, lease.deadline, batch, version, uri, retry, step1)

    def _sample_heap_top(self, count: int, out: list[SampledProblem]) -> None:
        """``heap`` sampler: the top ``count`` in heap order (priority desc, member desc)."""
        for _ in range(min(count, len(self._heap))):
            _, member = self._heap.pop()
            out.append(self._take(self._entry(member)))

    def _sample_weighted(self, count: int, rng: rules.XorShift32, out: list[SampledProblem]) -> None:
        """``weighted`` sampler: rank uniform over the remaining heap, accepted with
        probability (priority / 0.25)^alpha, at most 8 tries, else the top (store.py, step 3)."""
        alpha = self.config.alpha
        for _ in range(count):
            size = len(self._heap)
            if size == 0:
                return
            index = size - 1  # the top, when every try is rejected
            for _try in range(8):
                rank = min(math.floor(rng.random() * size), size - 1)
                prio = self._heap[size - 1 - rank][0]
                if rng.random() < (prio / rules.MAX_PRIORITY) ** alpha:
                    index = size - 1 - rank
                    break
            _, member = self._heap.pop(index)
            out.append(self._take(self._entry(member)))

    def _sample_uniform(self, count: int, rng: rules.XorShift32, out: list[SampledProblem]) -> None:
        """``uniform`` sampler over [heap in heap order, solved, unsolved] of the problems not leased."""
        solved, unsolved = self._pools[Pool.SOLVED], self._pools[Pool.UNSOLVED]
        for _ in range(count):
            nh, ns = len(self._heap), len(solved)
            n = nh + ns + len(unsolved)
            if n == 0:
                return
            idx = min(math.floor(rng.random() * n), n - 1)
            if idx < nh:
                _, member = self._heap.pop(nh - 1 - idx)
            elif idx < nh + ns:
                _, member = solved.pop(idx - nh)
            else:
                _, member = unsolved.pop(idx - nh - ns)
            out.append(self._take(self._entry(member)))

    async def _report(self, lease_id: str, outcomes: list[GroupOutcome]) -> ReportResult:
        now = self.clock()
        lease = self._leases.get(lease_id)
        if lease is None:
            tomb = self._tombstones.get(lease_id)
            self._counters["late_reports"] += 1
            return ReportResult(False, tomb[0] if tomb else "unknown lease")
        if lease.deadline <= now:
            self._expire_one(lease, now)
            self._counters["late_reports"] += 1
            return ReportResult(False, "expired")
        members = set(lease.problem_ids)
        for i, o in enumerate(outcomes):
            if o.problem_id not in members:
                raise InvalidArgument(
                    f"outcomes[{i}]: problem {o.problem_id!r} is not in lease {lease_id!r}; "
                    "report only the problems that lease returned"
                )
        # Validated: from here on nothing raises.
        params = self.config.params
        queued = filtered = 0
        c = self._counters
        for o in outcomes:
            e = self._problems[o.problem_id]
            source = e.home
            kind = rules.classify(o.rewards)
            e.stats = rules.update_stats(e.stats, o.rewards, params)
            prio = rules.priority(e.stats, params)
            dest = rules.destination(kind)
            self._place(e, dest, prio if dest is Pool.HEAP else float(lease.step))
            group_sum = 0.0
            for r in o.rewards:
                group_sum = group_sum + r
            c[_KIND_COUNTER[kind]] += 1
            c["completions_reported"] += len(o.rewards)
            c["reward_sum"] = c["reward_sum"] + group_sum
            if rules.is_forgetting(source, o.rewards):
                c["forgetting_events"] += 1
            if rules.is_breakthrough(source, o.rewards):
                c["breakthroughs"] += 1
            if kind is GroupKind.MIXED:
                self._enqueue(o.payload, now)
                queued += 1
            else:
                filtered += 1
        self._return_problems(lease, skip={o.problem_id for o in outcomes})
        self._end_lease(lease, "already reported", now)
        return ReportResult(True, "", queued, filtered)

    async def _expire_leases(self, limit: int) -> int:
        now = self.clock()
        return self._expire_due(now, limit)

    # -- trajectory queue -----------------------------------------------------------------
    def _enqueue(self, payload: bytes, now: float) -> None:
        """Append a group with a stream-style id "ms-seq" that always increases."""
        ms = int(math.floor(now * 1000.0))
        last_ms, last_seq = self._last_key
        key = (ms, 0) if ms > last_ms else (last_ms, last_seq + 1)
        self._last_key = key
        self._new[key] = _Group(key=key, payload=bytes(payload))

    def _deliver(self, g: _Group, consumer: str, now: float) -> Delivery:
        if g.consumer != consumer:
            if g.consumer:
                self._by_consumer[g.consumer].remove(g.key)
                if not self._by_consumer[g.consumer]:
                    del self._by_consumer[g.consumer]
            self._by_consumer.setdefault(consumer, SortedList()).add(g.key)
            g.consumer = consumer
        g.delivery_count += 1
        g.delivered_at = now
        return Delivery(_group_id(g.key), g.payload, g.delivery_count)

    async def queue_depth(self) -> int:
        return len(self._new)

    async def _pull(self, consumer: str, max_groups: int, include_own_pending: bool) -> list[Delivery]:
        now = self.clock()
        out: list[Delivery] = []
        if include_own_pending and consumer in self._by_consumer:
            for key in list(self._by_consumer[consumer][:max_groups]):
                out.append(self._deliver(self._pending[key], consumer, now))
        if len(out) < max_groups:
            timeout = self.config.redelivery_timeout_s
            idle = [g for g in self._pending.values() if now - g.delivered_at >= timeout]
            for g in idle[: max_groups - len(out)]:
                out.append(self._deliver(g, consumer, now))
        while len(out) < max_groups and self._new:
            key, g = self._new.popitem(last=False)
            self._pending[key] = g
            out.append(self._deliver(g, consumer, now))
        return out

    async def _ack(self, group_ids: list[str]) -> int:
        acked = 0
        for gid in group_ids:
            key = _parse_group_id(gid)
            g = self._pending.pop(key, None) if key is not None else None
            if g is None:
                continue
            mine = self._by_consumer[g.consumer]
            mine.remove(key)
            if not mine:
                del self._by_consumer[g.consumer]
            acked += 1
        self._counters["groups_acked"] += acked
        return acked

    # -- policy and introspection ---------------------------------------------------------
    async def _publish(self, version: int, weights_uri: str) -> tuple[int, str]:
        cur_version, cur_uri = self._policy
        if version < cur_version:
            raise FailedPrecondition(
                f"policy version {version} is older than the current version {cur_version}; versions never go backwards"
            )
        if version == cur_version and weights_uri != cur_uri:
            raise FailedPrecondition(
                f"policy version {version} is already published with weights_uri {cur_uri!r}; "
                f"publish a higher version for {weights_uri!r}"
            )
        self._policy = (version, weights_uri)
        return self._policy

    async def policy(self) -> tuple[int, str]:
        return self._policy

    async def _stats(self, histogram_buckets: int) -> StoreStats:
        edges = rules.histogram_edges(histogram_buckets)
        # bucket i: edges[i] <= p < edges[i+1]; the last bucket includes edges[-1] (0.25)
        cuts = [self._heap.bisect_left((edge,)) for edge in edges[:-1]] + [self._heap.bisect_right((edges[-1], "\U0010ffff"))]
        # (edge,) sorts before every (edge, member): bisect_left counts priorities < edge;
        # members are ASCII hex + id, so (0.25, max char) sorts after every (0.25, member).
        hist = [cuts[i + 1] - cuts[i] for i in range(histogram_buckets)]
        c = self._counters
        leased = sum(len(lease.problem_ids) for lease in self._leases.values())
        return StoreStats(
            problems=len(self._problems),
            heap_size=len(self._heap),
            solved=len(self._pools[Pool.SOLVED]),
            unsolved=len(self._pools[Pool.UNSOLVED]),
            leased=leased,
            active_leases=len(self._leases),
            step=self._step,
            policy_version=self._policy[0],
            weights_uri=self._policy[1],
            priority_histogram=hist,
            priority_bucket_edges=edges,
            queue_depth=len(self._new),
            pending_groups=len(self._pending),
            **{name: c[name] for name in COUNTER_NAMES},
        )

    async def problem_state(self, problem_id: str) -> ProblemState:
        e = self._problems.get(problem_id)
        if e is None:
            raise NotFound(f"problem {problem_id!r} is not registered; register it first (RegisterProblems)")
        return ProblemState(problem=e.record, stats=e.stats, pool=e.pool, score=e.score,
                            priority=rules.priority(e.stats, self.config.params))

    async def dump(self) -> dict:
        return {
            "problems": {pid: (int(e.pool), e.stats.n, e.stats.s1, e.stats.s2, e.score) for pid, e in self._problems.items()},
            "counters": dict(self._counters),
            "step": self._step,
            "policy": self._policy,
            "leases": sorted(sorted(lease.problem_ids) for lease in self._leases.values()),
            "queue": [g.payload for g in self._new.values()],
        }

    # -- persistence ----------------------------------------------------------------------
    def _snapshot_doc(self) -> dict[str, Any]:
        """The whole state as JSON-ready data (a consistent copy; payloads base64)."""
        b64 = lambda b: base64.b64encode(b).decode("ascii")  # noqa: E731
        return {
            "format": SNAPSHOT_FORMAT,
            "version": SNAPSHOT_VERSION,
            "step": self._step,
            "policy": list(self._policy),
            "counters": dict(self._counters),
            "problems": [
                [e.record.id, e.record.prompt, e.record.answer, e.record.verifier, dict(e.record.metadata),
                 e.stats.n, e.stats.s1, e.stats.s2, int(e.pool), int(e.home), e.score]
                for e in self._problems.values()
            ],
            "leases": [[lz.lease_id, lz.deadline, lz.step, list(lz.problem_ids)] for lz in self._leases.values()],
            "tombstones": [[lid, reason, ended] for lid, (reason, ended) in self._tombstones.items()],
            "queue": {
                "last_id": list(self._last_key),
                "new": [[_group_id(g.key), b64(g.payload)] for g in self._new.values()],
                "pending": [[_group_id(g.key), b64(g.payload), g.delivery_count, g.consumer, g.delivered_at]
                            for g in self._pending.values()],
            },
        }

    async def snapshot(self) -> None:
        """Write the state to ``snapshot_path`` atomically (temp file, fsync, os.replace).

        The state is copied on the event loop (consistent), then encoded and written in a
        worker thread. No-op without a snapshot path.

        Raises:
            OSError: the directory is not writable (the previous snapshot stays intact).
        """
        if self.snapshot_path is None:
            return
        doc = self._snapshot_doc()
        await asyncio.to_thread(_write_atomic, self.snapshot_path, doc)

    async def close(self) -> None:
        """Write the snapshot (when a path is set)."""
        await self.snapshot()

    def _restore(self, path: Path) -> None:
        try:
            with open(path, "rb") as f:
                doc = json.load(f)
            self._load_doc(doc)
        except InvalidArgument as e:
            raise InvalidArgument(f"snapshot {str(path)!r} is corrupt: {e}; move it away to start empty, or restore a good copy") from e
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
            raise InvalidArgument(
                f"snapshot {str(path)!r} cannot be read or is corrupt ({type(e).__name__}: {e}); "
                "move it away to start empty, or restore a good copy"
            ) from e

    def _load_doc(self, doc: dict) -> None:
        """Rebuild the state from a snapshot document; checks its consistency first."""
        if not isinstance(doc, dict) or doc.get("format") != SNAPSHOT_FORMAT:
            raise InvalidArgument(f"not a {SNAPSHOT_FORMAT} snapshot")
        if doc.get("version") != SNAPSHOT_VERSION:
            raise InvalidArgument(f"snapshot version {doc.get('version')!r} is not the supported {SNAPSHOT_VERSION}")
        fresh = MemoryStore(self.config, None, self.clock)  # build aside, swap in when complete
        step = doc["step"]
        version, uri = doc["policy"]
        if not (isinstance(step, int) and step >= 0 and isinstance(version, int) and version >= 0 and isinstance(uri, str)):
            raise InvalidArgument("step or policy has a wrong type")
        fresh._step, fresh._policy = step, (version, uri)
        counters = doc["counters"]
        if set(counters) != set(COUNTER_NAMES):
            raise InvalidArgument(f"counters must be exactly {', '.join(COUNTER_NAMES)}")
        fresh._counters = {k: _number(counters[k], k) for k in COUNTER_NAMES}
        for row in doc["problems"]:
            pid, prompt, answer, verifier, metadata, n, s1, s2, pool, home, score = row
            rec = ProblemRecord(pid, prompt, answer, verifier, {str(k): str(v) for k, v in metadata.items()})
            if not isinstance(pid, str) or pid in fresh._problems:
                raise InvalidArgument(f"problem id {pid!r} is not a string or appears twice")
            pool, home = Pool(pool), Pool(home)
            e = _Entry(rec, rules.tie_member(pid, self.config.seed),
                       Stats(_number(n, "n"), _number(s1, "s1"), _number(s2, "s2")), pool, home, _number(score, "score"))
            fresh._problems[pid] = e
            if pool is Pool.LEASED:
                if home is Pool.LEASED:
                    raise InvalidArgument(f"leased problem {pid!r} has no pool to return to")
            else:
                if home is not pool:
                    raise InvalidArgument(f"problem {pid!r} is in {pool.name} but would return to {home.name}")
                fresh._place(e, pool, e.score)
        leased_seen: set[str] = set()
        for lease_id, deadline, lstep, ids in doc["leases"]:
            if not (isinstance(lease_id, str) and isinstance(lstep, int) and isinstance(ids, list)):
                raise InvalidArgument(f"lease {lease_id!r} has a wrong type")
            for pid in ids:
                if fresh._problems[pid].pool is not Pool.LEASED or pid in leased_seen:
                    raise InvalidArgument(f"problem {pid!r} of lease {lease_id!r} is not leased, or leased twice")
                leased_seen.add(pid)
            lz = _LeaseRec(lease_id, _number(deadline, "deadline"), lstep, [str(p) for p in ids])
            fresh._leases[lease_id] = lz
            fresh._deadlines.add((lz.deadline, lease_id))
        if leased_seen != {pid for pid, e in fresh._problems.items() if e.pool is Pool.LEASED}:
            raise InvalidArgument("a leased problem belongs to no lease")
        for lease_id, reason, ended in doc["tombstones"]:
            if reason not in ("already reported", "expired"):
                raise InvalidArgument(f"tombstone reason {reason!r} is unknown")
            fresh._tombstones[str(lease_id)] = (reason, _number(ended, "ended"))
        q = doc["queue"]
        ms, seq = q["last_id"]
        fresh._last_key = (int(ms), int(seq))
        for gid, payload in q["new"]:
            key = _checked_key(gid)
            fresh._new[key] = _Group(key, base64.b64decode(payload, validate=True))
        for gid, payload, count, consumer, delivered_at in q["pending"]:
            key = _checked_key(gid)
            g = _Group(key, base64.b64decode(payload, validate=True), int(count), str(consumer), _number(delivered_at, "delivered_at"))
            if not g.consumer or g.delivery_count < 1 or key in fresh._new:
                raise InvalidArgument(f"pending group {gid!r} has no consumer, no delivery, or is also undelivered")
            fresh._pending[key] = g
            fresh._by_consumer.setdefault(g.consumer, SortedList()).add(key)
        self.__dict__.update({k: v for k, v in fresh.__dict__.items() if k.startswith("_")})


def _number(value: Any, name: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgument(f"{name} ({value!r}) is not a finite number")
    return value


def _checked_key(group_id: Any) -> tuple[int, int]:
    key = _parse_group_id(group_id) if isinstance(group_id, str) else None
    if key is None:
        raise InvalidArgument(f"group id {group_id!r} is not of the form 'ms-seq'")
    return key


def _write_atomic(path: Path, doc: dict) -> None:
    """Write ``doc`` as JSON to ``path``: temp file in the same directory, fsync, os.replace."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"), allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass

