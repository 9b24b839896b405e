"""The Redis store's read-only views: statistics for ``GetStats`` and the metrics, one problem's
state, and the canonical dump the differential tests compare with the memory store's."""

from __future__ import annotations

from prioreplay import rules
from prioreplay.errors import NotFound
from prioreplay.unseen_prior import UnseenFit

from ..contract import UNSEEN_SCORE, add_unseen, histogram_edges, member_id
from ..records import ProblemState, StoreStats
from ..snapshot import COUNTER_NAMES
from .keys import decode_problem, float_arg, parse_stats, text
from .layouts import LEASE
from .queue import RedisQueue
from .scripts import SCRIPT_ARGS

SEEN = SCRIPT_ARGS["seen"]
#: The store's counters kept as integers (every one of the memory store's but the reward sum).
_INT_COUNTERS = tuple(name for name in COUNTER_NAMES if name != "reward_sum")


class RedisInspection(RedisQueue):
    """The read-only views of :class:`.store.RedisStore` (a base class of it): each reads in one
    pipelined round trip (the queue's counts in one MULTI/EXEC)."""

    async def _stats(self, histogram_buckets: int) -> StoreStats:
        k = self._keys
        edges = histogram_edges(histogram_buckets)
        now_v = 0 if self.config.heap_age_decay == 1 else int(await self._do(self._r.hget(k["policy"], "version")) or 0)
        cut = [float_arg(self.heap_score(edge, now_v)) for edge in edges]  # the edges as heap scores now
        low = "(" + float_arg(UNSEEN_SCORE) if self.unseen_band else "-inf"  # the unseen band is counted apart

        def fill(p):
            p.hlen(k["problems"])
            p.zcard(k["heap"])
            p.zcard(k["solved"])
            p.zcard(k["unsolved"])
            p.hlen(k["leases"])
            p.hgetall(k["counters"])
            p.hmget(k["policy"], "version", "uri")
            p.hlen(k["quarantine"])
            p.zcount(k["heap"], UNSEEN_SCORE, UNSEEN_SCORE)
            for i in range(histogram_buckets):
                p.zcount(k["heap"], cut[i] if i else low, cut[i + 1] if i == histogram_buckets - 1 else "(" + cut[i + 1])

        res = await self._pipe(fill)
        problems, heap, solved, unsolved, leases, counters, (ver, uri), quarantined, band = res[:9]
        c = {text(a): text(b) for a, b in counters.items()}
        unseen = self.unseen_priority(_unseen_fit(c))
        hist = [int(x) for x in res[9:]]
        if "problems_seen" not in c and int(problems):  # a namespace older than the counter: count once
            c["problems_seen"] = await self._run("seen", SEEN.key_list(k), [])
        queue_depth, pending = await self._queue_counts()
        return StoreStats(
            problems=int(problems),
            heap_size=int(heap),
            solved=int(solved),
            unsolved=int(unsolved),
            leased=int(problems) - int(heap) - int(solved) - int(unsolved) - int(quarantined),
            active_leases=int(leases),
            quarantined=int(quarantined),
            step=int(c.get("step", 0)),
            policy_version=int(ver or 0),
            weights_uri=text(uri),
            priority_histogram=add_unseen(hist, edges, int(band), unseen) if self.unseen_band else hist,
            priority_bucket_edges=edges,
            reward_sum=float(c.get("reward_sum", 0.0)),
            queue_depth=queue_depth,
            pending_groups=pending,
            unseen=max(0, int(problems) - int(c.get("problems_seen", 0))),
            unseen_priority=unseen,
            **{name: int(c.get(name, 0)) for name in _INT_COUNTERS},
        )

    async def problem_state(self, problem_id: str) -> ProblemState:
        """A problem's state (statistics, pool, score, priority).

        Raises:
            NotFound: no problem with this id is registered.
        """
        stats_value, record = await self._pipe(
            lambda p: (p.hget(self._keys["stats"], problem_id), p.hget(self._keys["problems"], problem_id))
        )
        if stats_value is None or record is None:
            raise NotFound(f"problem {problem_id!r} is not registered; register it first (RegisterProblems)")
        stats, pool, score = parse_stats(stats_value)
        return ProblemState(
            problem=decode_problem(problem_id, record),
            stats=stats,
            pool=pool,
            score=score,
            priority=rules.priority(stats, self.config.params),
        )

    async def dump(self) -> dict:
        """Canonical state (see :meth:`Store.dump`); reads everything, for tests and debugging."""
        k = self._keys
        stats, counters, step_policy, leases, evidence = await self._pipe(
            lambda p: (
                p.hgetall(k["stats"]),
                p.hgetall(k["counters"]),
                p.hmget(k["policy"], "version", "uri"),
                p.hvals(k["leases"]),
                p.hgetall(k["evidence"]),
            )
        )
        problems = {}
        for pid, value in stats.items():
            st, pool, score = parse_stats(value)
            problems[text(pid)] = (int(pool), st.n, st.s1, st.s2, score)
        c = {text(a): text(b) for a, b in counters.items()}
        out_counters: dict[str, float | int] = {name: int(c.get(name, 0)) for name in _INT_COUNTERS}
        out_counters["reward_sum"] = float(c.get("reward_sum", 0.0))
        fit = _unseen_fit(c)
        lease_lists = sorted(sorted(member_id(item["member"]) for item in _lease_items(text(rec))) for rec in leases)
        return {
            "problems": problems,
            "counters": out_counters,
            "step": int(c.get("step", 0)),
            "policy": (int(step_policy[0] or 0), text(step_policy[1])),
            "leases": lease_lists,
            "queue": await self._undelivered(),
            "evidence": {text(pid): tuple(int(x) for x in text(v).split()) for pid, v in sorted(evidence.items())},
            "unseen_fit": (fit.visits, fit.priority_sum),
        }


def _unseen_fit(counters: dict[str, str]) -> UnseenFit:
    """The first-visit sums of the prior for unseen problems, from the ``counters`` hash (report.lua)."""
    return UnseenFit(int(counters.get("first_visits", 0)), float(counters.get("first_visit_priority_sum", 0.0)))


def _lease_items(record: str) -> list[dict[str, str]]:
    """The leased problems of a lease record (:data:`.layouts.LEASE`), each ``{member, source, score}``."""
    fields = record.split(LEASE.sep)
    return LEASE.items(fields, (len(fields) - len(LEASE.head)) // len(LEASE.each))
