"""The production store: Redis (redis-py asyncio, hiredis parser) with one Lua script per change.

Semantics are those of :mod:`prioreplay.priority_server.store.base` (module docstring), bit for bit
equal to the in-process ``MemoryStore`` for the same seed, clock readings and operations (with a
clock injected into both: see "Time").

The key schema and the values' formats are in :mod:`.keys`; the error taxonomy in :mod:`.errors`;
the scripts and their declared arguments in :mod:`.scripts`.

Every multi-key change is one Lua script call (``lua/<name>.lua``, with ``lua/lib.lua``
prepended), registered once with redis-py ``register_script`` (EVALSHA, falling back to
SCRIPT LOAD after a restart or SCRIPT FLUSH). Register sends chunks of
``REGISTER_CHUNK`` problems, pipelined.

Time: every lease deadline, every comparison against one and every tombstone time is read on
Redis's clock (``TIME`` inside the scripts, ``lua/lib.lua`` ``clock_now``), so every server replica
and process of a run reads one clock, whatever its host's clock says; the scripts return the
reading they used (a short batch's retry hint). A ``clock`` injected into the store (tests only:
the differential tests' fake clock) is passed to the scripts as ARGV ``now`` instead. Redelivery of
unacknowledged trajectory groups always uses Redis's clock (XAUTOCLAIM measures idle time), as
do stream entry ids (the group ids).

The sampler runs as its Lua branch (``SamplerSpec.lua_branch``, a function in ``sample.lua``).
The samplers' RNG seed depends on the step (``samplers.step_seed`` is a BLAKE2 hash, computed in
Python). The store passes the step it expects; when another server instance moved the step in
between, the script changes nothing and returns the current step, and the call is retried
(a sampler with ``uses_rng=False``, such as ``heap``, never retries).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

from prioreplay import rules
from prioreplay.errors import FailedPrecondition, InvalidArgument, NotFound, StoreUnavailable
from prioreplay.problems import ProblemRecord
from prioreplay.rules import Pool
from prioreplay.unseen_prior import UnseenFit

from ...config import ReplicationSettings, StoreConfig
from ...samplers import SAMPLERS, step_seed
from ..contract import (
    UNSEEN_SCORE,
    QueueWatch,
    add_unseen,
    conflict_error,
    histogram_edges,
    member_id,
    renew_refusal,
    same_text,
    tie_member,
)
from ..records import (
    Delivery,
    GroupOutcome,
    Lease,
    ProblemState,
    Renewal,
    ReportResult,
    SampledProblem,
    StoreStats,
)
from ..snapshot import COUNTER_NAMES
from .client import WAIT_REPLIES, RedisClient
from .keys import decode_problem, encode_problem, float_arg, parse_stats, text, warm_arg
from .pace import RedisPace, pace_args
from .scripts import SCRIPT_ARGS, report_run, sample_run

REGISTER, SAMPLE, REPORT, RENEW = (SCRIPT_ARGS[n] for n in ("register", "sample", "report", "renew"))
EXPIRE, PULL, ACK, PUBLISH, SEEN = (SCRIPT_ARGS[n] for n in ("expire", "pull", "ack", "publish", "seen"))
#: Problems per register script call.
REGISTER_CHUNK = 2000
#: Consumer group of the trajectory stream.
CONSUMER_GROUP = "learners"
#: Waiting pulls that may hold a pooled connection in ``XREAD BLOCK`` at once, per store (process);
#: more wait for a free one (each pull still ends by its ``wait_s``).
MAX_BLOCKED_PULLS = 32
#: Attempts of a weighted/uniform sample when other servers keep moving the step.
STEP_RETRIES = 32

#: The store's counters kept as integers (every one of the memory store's but the reward sum).
_INT_COUNTERS = tuple(name for name in COUNTER_NAMES if name != "reward_sum")
log = logging.getLogger(__name__)
_STREAM_ID_RE = re.compile(r"^\d{1,20}-\d{1,20}$")


class RedisStore(RedisClient):
    """The store on Redis: durable, shared by several server processes, one round trip per change.

    Args:
        config: sampling and bookkeeping parameters (must match across servers of one run).
        url: ``redis://[:password@]host:port/db`` (or ``rediss://``, ``unix://``), or
            ``redis+sentinel://host:port[,host:port]/service_name[/db]`` (the primary Sentinel names,
            followed through failovers; :mod:`.connection`).
        namespace: the run's name; 1–MAX_NAME_BYTES (128) characters of ``[A-Za-z0-9_.:-]`` (no
            braces: it is the hash tag).
        clock: None (the default, and always in a server): lease time is Redis's clock. A callable
            returning unix seconds: tests only, the lease clock of every script (deterministic
            differential tests against the memory store with the same clock).
        replication: ``min_replica_acks`` ``all`` (the default; counted by :mod:`.replicas`) or N:
            each script of :data:`.scripts.WAITED_SCRIPTS` is followed by a small write and ``WAIT n
            timeout``; a shortfall raises StoreUnavailable (kind ``read_only``; the change is applied
            on the primary but not known to survive a failover: a retry is answered as for a lost answer).

    Raises:
        InvalidArgument: a malformed URL or namespace, or a sampler without a Lua branch.
        StoreUnavailable: (from every method) Redis cannot be reached, is read-only, out of memory
            or busy (``kind``, :func:`.errors.error_kind`); the message carries the URL with its password
            redacted and the fix. Nothing was changed (each change is one script).
        Internal: (from every method) Redis answered another error (WRONGTYPE, a script error).
    """

    def __init__(
        self,
        config: StoreConfig,
        url: str,
        namespace: str = "default",
        clock: Callable[[], float] | None = None,
        replication: ReplicationSettings | None = None,
    ):
        self._sampler = SAMPLERS[config.sampler]
        if self._sampler.lua_branch is None:
            raise InvalidArgument(f"sampler {config.sampler!r} runs in the memory store only; use --store memory")
        super().__init__(config, url, namespace, clock, replication)
        self._step_hint: int | None = None
        self._bands = config.bands
        self._report_run = report_run(config)
        self._sampler_arg = json.dumps(self._sampler.lua_args(config.sampler_params))
        self._blocked_pulls = asyncio.Semaphore(MAX_BLOCKED_PULLS)
        self.pace = RedisPace(self)

    # -- run settings ---------------------------------------------------------------------
    async def _claim_settings(self, wanted: dict) -> dict:
        key = self._keys["settings"]
        _, stored = await self._pipe(lambda p: (p.set(key, json.dumps(wanted, sort_keys=True), nx=True), p.get(key)))
        return json.loads(text(stored))

    async def _put_settings(self, wanted: dict) -> None:
        await self._do(self._r.set(self._keys["settings"], json.dumps(wanted, sort_keys=True)))

    # -- problems -------------------------------------------------------------------------
    async def _count_problems(self) -> int:
        return int(await self._do(self._r.hlen(self._keys["problems"])))

    async def _register(self, problems: list[ProblemRecord], replace: bool) -> tuple[int, int, int]:
        seed = self.config.seed
        keys = REGISTER.key_list(self._keys)
        prio = float_arg(self.registered_score(rules.Stats()))
        initial = f"0 0 0 {int(Pool.HEAP)} {prio}"
        script = self._scripts["register"]
        if not replace and len(problems) > REGISTER_CHUNK:
            await self._refuse_clashes(problems)  # each script checks its own chunk; the call is several

        async def fill(pipe):
            for start in range(0, len(problems), REGISTER_CHUNK):
                part = problems[start : start + REGISTER_CHUNK]
                chunk = "\n".join(f"{p.id}\t{tie_member(p.id, seed)}\t{encode_problem(p)}" for p in part)
                warm = warm_arg(part, self._warm, self.registered_score)
                call_keys, args = self._script_call(
                    keys, REGISTER.arg_list(initial=initial, priority=prio, chunk=chunk, replace=int(replace), warm=warm)
                )
                await script(keys=call_keys, args=args, client=pipe)
            pipe.hlen(self._keys["problems"])
            if want:
                self._wait(pipe, want)

        want = await self._replicas.wanted()
        res = await self._pipe(fill, transaction=False)
        if want:
            await self._check_acks("register", res[-WAIT_REPLIES:], want)
            del res[-WAIT_REPLIES:]
        clashes = [text(pid) for r in res[:-1] if int(r[0]) == -1 for pid in r[1:]]
        if clashes:  # only a registration racing another one gets here with several chunks
            raise conflict_error(clashes)
        created = sum(int(r[0]) for r in res[:-1])
        updated = sum(int(r[1]) for r in res[:-1])
        return created, updated, int(res[-1])

    async def _refuse_clashes(self, problems: list[ProblemRecord]) -> None:
        """Raise :func:`conflict_error` when a registered id holds another prompt or answer (one read)."""
        stored = await self._do(self._r.hmget(self._keys["problems"], [p.id for p in problems]))
        clashes = [
            p.id for p, v in zip(problems, stored, strict=True) if v is not None and not same_text(decode_problem(p.id, v), p)
        ]
        if clashes:
            raise conflict_error(clashes)

    # -- leases ---------------------------------------------------------------------------
    async def _sample(self, batch_size: int, lease_timeout_s: float, request_id: str = "", worker_id: str = "") -> Lease:
        cfg = self.config
        lease_id = secrets.token_hex(16)
        rate = batch_size * cfg.retest_fraction if self._sampler.retests else 0.0  # samplers.retest_quota, in Lua
        keys = SAMPLE.key_list(self._keys)
        run = sample_run(cfg, rate, pace_args(cfg, self._sampler.retests, CONSUMER_GROUP))
        for _ in range(STEP_RETRIES):
            expected, seed32 = -1, 1
            if self._sampler.uses_rng:
                if self._step_hint is None:
                    self._step_hint = int(await self._do(self._r.hget(self._keys["counters"], "step")) or 0)
                expected = self._step_hint
                seed32 = step_seed(cfg.seed, expected + 1)
            res = await self._run(
                "sample",
                keys,
                SAMPLE.arg_list(
                    now=self._now_arg(),
                    batch_size=batch_size,
                    lease_s=float_arg(lease_timeout_s),
                    lease_id=lease_id,
                    expected_step=expected,
                    seed32=seed32,
                    request_id=request_id,
                    worker_id=worker_id,
                    run=run,
                    sampler=self._sampler_arg,
                ),
            )
            if res[0] == b"SAME":  # a retried request: its live lease again
                lease_id = text(res[-3])
                break
            if res[0] == b"STEP":
                self._step_hint = int(res[1])
                continue
            if res[0] == b"PACE":  # no room under the pace bound (base.py, "sample" 1b)
                wait_s = float(res[4]) - float(res[5]) if res[4] else math.inf
                return self.pace_refusal(int(res[2]), text(res[3]), int(res[1]), wait_s)
            break
        else:
            raise StoreUnavailable(f"sample: the step kept moving under {STEP_RETRIES} attempts; retry")
        return self._lease(res, batch_size, float(res[-1]), lease_id, float(res[-2]))

    def _lease(self, res: list, batch_size: int, now: float, lease_id: str, deadline: float) -> Lease:
        """The :class:`Lease` of a ``sample.lua`` answer ``res`` (``OK`` or ``SAME``) for a request of
        ``batch_size`` at ``now`` (the script's clock reading) with deadline ``deadline``; a short
        batch gets a retry hint, an empty one no lease id."""
        step, version, uri = int(res[1]), int(res[2]), text(res[3])
        if res[0] != b"SAME":  # a replayed lease carries its own (older) step
            self._step_hint = step
        earliest = [float(res[4])] if res[4] else []
        problems = self._decode_picks(res, int(res[5]), version)
        if problems:
            earliest.append(deadline)
        retry = 0.0
        if len(problems) < batch_size:
            retry = max(0.05, min(5.0, min(earliest) - now)) if earliest else 1.0
        return Lease(
            lease_id=lease_id if problems else "",
            deadline=deadline if problems else 0.0,
            problems=problems,
            policy_version=version,
            weights_uri=uri,
            retry_after_s=retry,
            step=step,
        )

    def _decode_picks(self, res: list, n: int, version: int) -> list[SampledProblem]:
        """The ``n`` leased problems of a ``sample.lua`` answer at policy ``version``: five slots each
        from index 7 (member, source pool, statistics value, problem record, group size or 0);
        index 6 holds ω_unseen (the priority of a problem from the heap's unseen band)."""
        problems: list[SampledProblem] = []
        unseen = float(res[6])
        for i in range(7, 7 + 5 * n, 5):
            member, source, stats_value, record = text(res[i]), Pool(int(res[i + 1])), res[i + 2], res[i + 3]
            stats, _, score = parse_stats(stats_value)
            prio = self.leased_priority(source, score, stats, version, unseen)
            problems.append(SampledProblem(decode_problem(member_id(member), record), prio, source, int(res[i + 4]) or None))
        return problems

    async def _report(
        self, lease_id: str, outcomes: list[GroupOutcome], unservable: Sequence[str] = (), more_parts: bool = False
    ) -> ReportResult:
        seed = self.config.seed
        rest: list[Any] = []
        kinds = []
        for o in outcomes:
            rewards = [float(r) for r in o.rewards]
            kinds.append(rules.classify(rewards))
            sr, sq = rules.reward_sums(rewards)
            # the script counts a forgetting event / breakthrough when the problem came from the
            # solved / unsolved pool: send whether it would be one
            forgetting = rules.is_forgetting(Pool.SOLVED, rewards, self._bands)
            breakthrough = rules.is_breakthrough(Pool.UNSOLVED, rewards, self._bands)
            rest += [
                f"{tie_member(o.problem_id, seed)}\t{kinds[-1].value}\t{len(rewards)}\t"
                f"{float_arg(sr)}\t{float_arg(sq)}\t{int(forgetting)}\t{int(breakthrough)}\t{max(0, int(o.completion_tokens))}\t"
                f"{rules.evidence_groups(len(rewards), self.config.pool_evidence)}",
                bytes(o.payload),
            ]
        rest += [len(unservable), *(tie_member(pid, seed) for pid in unservable)]
        args = REPORT.arg_list(
            rest,
            now=self._now_arg(),
            lease_id=lease_id,
            more_parts=int(more_parts),
            group=CONSUMER_GROUP,
            run=self._report_run,
            n_outcomes=len(outcomes),
        )
        res = await self._run("report", REPORT.key_list({**self._keys, "parts": self.key(f"parts:{lease_id}")}), args)
        status = int(res[0])
        if status == 0:
            return ReportResult(accepted=False, reason=text(res[1]))
        if status == -1:
            j = int(res[1])
            raise InvalidArgument(
                f"outcomes[{j}]: problem {outcomes[j].problem_id!r} is not in lease {lease_id}; "
                "report only the problems that lease returned"
            )
        if status == -2:
            j = int(res[1])
            raise InvalidArgument(
                f"unservable[{j}]: problem {unservable[j]!r} is not in lease {lease_id}; "
                "report only the problems that lease returned"
            )
        return ReportResult(
            accepted=True,
            groups_queued=int(res[1]),
            groups_filtered=int(res[2]),
            skipped=int(res[3]),
            quarantined=int(res[4]),
            kinds=tuple(kinds),
        )

    async def _renew(self, lease_id: str, worker_id: str, lease_timeout_s: float) -> Renewal:
        keys = RENEW.key_list({**self._keys, "parts": self.key(f"parts:{lease_id}")})
        args = RENEW.arg_list(now=self._now_arg(), lease_id=lease_id, worker_id=worker_id, lease_s=float_arg(lease_timeout_s))
        res = await self._run("renew", keys, args)
        status = int(res[0])
        if status == 0:
            raise renew_refusal(lease_id, text(res[1]))
        if status == -1:
            raise renew_refusal(lease_id, "another worker", worker_id, text(res[1]))
        return Renewal(float(res[1]), int(res[2]))

    async def _expire_leases(self, limit: int) -> int:
        if limit < 1:
            return 0
        args = EXPIRE.arg_list(now=self._now_arg(), limit=limit)
        return int(await self._run("expire", EXPIRE.key_list(self._keys), args))

    # -- trajectory queue -----------------------------------------------------------------
    async def _pull(self, consumer: str, max_groups: int, include_own_pending: bool) -> list[Delivery]:
        return (await self._pull_script(consumer, max_groups, include_own_pending, watch=False))[0]

    async def _pull_watched(self, consumer: str, max_groups: int, include_own_pending: bool) -> tuple[list[Delivery], QueueWatch]:
        out, watch = await self._pull_script(consumer, max_groups, include_own_pending, watch=True)
        assert watch is not None  # asked for
        return out, watch

    async def _pull_script(
        self, consumer: str, max_groups: int, include_own_pending: bool, watch: bool
    ) -> tuple[list[Delivery], QueueWatch | None]:
        """pull.lua; with ``watch``, also the stream id and idle time a waiting pull blocks on."""
        min_idle_ms = max(1, int(round(self.config.redelivery_timeout_s * 1000)))
        args = PULL.arg_list(
            group=CONSUMER_GROUP,
            consumer=consumer,
            max=max_groups,
            own=int(include_own_pending),
            min_idle_ms=min_idle_ms,
            watch=int(watch),
        )
        res = await self._run("pull", PULL.key_list(self._keys), args)
        w = None
        if watch:
            idle_ms = int(res[-1])
            w = QueueWatch(text(res[-2]), idle_ms / 1000.0 if idle_ms >= 0 else math.inf)
            res = res[:-2]
        out = [
            Delivery(group_id=text(res[i]), payload=bytes(res[i + 1]), delivery_count=int(res[i + 2]))
            for i in range(0, len(res), 3)
        ]
        return out, w

    async def _wait_queued(self, watch: QueueWatch, timeout_s: float) -> None:
        """``XREAD BLOCK`` from the consumer group's last-delivered id: Redis answers at the next
        ``XADD`` of a report (any process, any replica's clients) or after ``timeout_s``. At most
        :data:`MAX_BLOCKED_PULLS` pulls hold a pooled connection blocked at once, on the blocking
        client, whose reply time-out exceeds the block (:mod:`.connection`): an empty queue is no error.

        Raises:
            StoreUnavailable: Redis cannot be reached (as every call, :meth:`_error`).
        """
        deadline = time.monotonic() + timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                await self._blocked_pulls.acquire()
        except TimeoutError:
            return
        try:
            block_ms = int(min(deadline - time.monotonic(), self._connection.max_block_s) * 1000)
            if block_ms >= 1:  # BLOCK 0 would block for ever
                blocking = self._connection.blocking
                await self._do(blocking.xread({self._keys["stream"]: watch.mark}, count=1, block=block_ms))
        finally:
            self._blocked_pulls.release()

    async def _release(self, consumer: str, deliveries: list[Delivery]) -> int:
        idle_ms = max(1, int(round(self.config.redelivery_timeout_s * 1000))) + 1
        ids = [d for d in deliveries if _STREAM_ID_RE.match(d.group_id)]
        if not ids:
            return 0

        def fill(pipe):
            for d in ids:
                # XCLAIM ... IDLE: idle at once (XAUTOCLAIM of the next pull takes it first);
                # RETRYCOUNT: the delivery count as before; JUSTID: not counted as a delivery
                pipe.xclaim(
                    self._keys["stream"],
                    CONSUMER_GROUP,
                    consumer,
                    0,
                    [d.group_id],
                    idle=idle_ms,
                    retrycount=max(0, d.delivery_count - 1),
                    justid=True,
                )

        return sum(len(r) for r in await self._pipe(fill))

    async def _ack(self, group_ids: list[str]) -> int:
        ids = [g for g in group_ids if _STREAM_ID_RE.match(g)]
        if not ids:
            return 0
        return int(await self._run("ack", ACK.key_list(self._keys), ACK.arg_list(ids, group=CONSUMER_GROUP)))

    # -- policy ---------------------------------------------------------------------------
    async def _publish(self, version: int, weights_uri: str) -> tuple[int, str]:
        res = await self._run("publish", PUBLISH.key_list(self._keys), PUBLISH.arg_list(version=version, uri=weights_uri))
        status, cur_v, cur_uri = int(res[0]), int(res[1]), text(res[2])
        if status == 1:
            raise FailedPrecondition(
                f"policy version {version} is lower than the current version {cur_v}; versions never go back"
            )
        if status == 2:
            raise FailedPrecondition(
                f"policy version {version} is already published with weights_uri {cur_uri!r}; "
                "publish a new version for new weights"
            )
        return cur_v, cur_uri

    async def policy(self) -> tuple[int, str]:
        """The current (policy_version, weights_uri); (0, "") before the first publish."""
        v, uri = await self._do(self._r.hmget(self._keys["policy"], "version", "uri"))
        return int(v or 0), text(uri)

    # -- inspection -----------------------------------------------------------------------
    async def _queue_counts(self) -> tuple[int, int]:
        """(undelivered, pending) groups of the stream, read in one MULTI/EXEC.

        One snapshot: read in two round trips, a pull or an ack by another client (or another
        server process) in between could make undelivered = length - pending negative.
        """
        k = self._keys["stream"]

        async def go():
            async with self._r.pipeline(transaction=True) as p:
                p.xlen(k)
                p.xpending(k, CONSUMER_GROUP)
                return await p.execute(raise_on_error=False)

        length, pending = await self._do(go())
        if isinstance(pending, Exception):  # no stream (nothing reported yet), hence no group
            if int(length):
                raise pending
            return 0, 0
        n_pending = int(pending["pending"])
        return int(length) - n_pending, n_pending

    async def queue_depth(self) -> int:
        return (await self._queue_counts())[0]

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
        lease_lists = sorted(sorted(member_id(f) for f in text(rec).split("\t")[2::3]) for rec in leases)
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

    async def _undelivered(self) -> list[bytes]:
        k = self._keys["stream"]
        if not await self._do(self._r.exists(k)):
            return []
        groups = await self._do(self._r.xinfo_groups(k))
        last = next(text(g["last-delivered-id"]) for g in groups if text(g["name"]) == CONSUMER_GROUP)
        entries = await self._do(self._r.xrange(k, min="(" + last, max="+"))
        return [bytes(fields[b"p"]) for _, fields in entries]


def _unseen_fit(counters: dict[str, str]) -> UnseenFit:
    """The first-visit sums of the prior for unseen problems, from the ``counters`` hash (report.lua)."""
    return UnseenFit(int(counters.get("first_visits", 0)), float(counters.get("first_visit_priority_sum", 0.0)))
