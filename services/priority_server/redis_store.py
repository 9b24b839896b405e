"""The production store: Redis (redis-py asyncio, hiredis parser) with one Lua script per change.

Semantics are those of :mod:`prioreplay.priority_server.store` (module docstring), bit for bit
equal to the in-process ``MemoryStore`` for the same seed, clock readings and operations.

Data model (every key is ``prioreplay:{<namespace>}:<name>``, made by :meth:`RedisStore.key`;
the hash tag ``{<namespace>}`` puts a whole run in one Redis Cluster slot):

============== ======= ========================================================================
name           type    content
============== ======= ========================================================================
problems       hash    id → JSON ``[prompt, answer, verifier, metadata]``
stats          hash    id → ``"n s1 s2 pool score"`` (floats as ``%.17g``: exact round trip;
                       pool = rules.Pool value; score = heap priority, pool: last tested step (the
                       policy version with retest_versions), leased: the score it returns with)
heap           zset    score = priority, member = ``store.tie_member(id, seed)``
solved         zset    score = last tested step (or policy version: rules.pool_score), member as above
unsolved       zset    score = last tested step (or policy version: rules.pool_score), member as above
leases         hash    lease id → ``"step\\tdeadline"`` + ``"\\tmember\\tsource\\tscore"`` per problem
deadlines      zset    score = lease deadline (unix s), member = lease id
tomb:reported  zset    lease id → time it was reported (kept ``TOMBSTONE_TTL_S``)
tomb:expired   zset    lease id → time it expired (kept ``TOMBSTONE_TTL_S``)
counters       hash    ``step`` and the StoreStats counters (``reward_sum`` as ``%.17g``)
policy         hash    ``version``, ``uri``
health         string  the health probe's last write (expires after 60 s)
quarantine     hash    id → the pool (1..3) a quarantined problem returns to (stats pool = 5)
requests       hash    request id → the lease a sample with that id made (retried requests)
requests:due   zset    score = that lease's deadline, member = request id (pruned by ``sample``)
owners         hash    lease id → JSON ``[worker id, request id]`` of a live lease sampled with either
                       (``renew`` checks the holder and moves the request id's deadline); dropped
                       when the lease ends
settings       string  JSON of the run settings the namespace was made with (``store.run_settings``)
stream         stream  trajectory groups (field ``p`` = payload), consumer group ``learners``
tokens         hash    id → ``"completions tokens"``: decayed sums of the reports that carried token
                       ids (the running mean of completion tokens; ``cost-aware``, ``knapsack``)
============== ======= ========================================================================

Every multi-key change is one Lua script call (``lua/<name>.lua``, with ``lua/lib.lua``
prepended), registered once with redis-py ``register_script`` (EVALSHA, falling back to
SCRIPT LOAD after a restart or SCRIPT FLUSH). Register sends chunks of
``REGISTER_CHUNK`` problems, pipelined.

Time: every deadline and tombstone uses the injected ``clock`` (passed to Lua as ARGV), never
Redis TIME. The one exception is redelivery of unacknowledged trajectory groups: XAUTOCLAIM
measures idle time with Redis's own clock, so ``redelivery_timeout_s`` elapses in real time
whatever the injected clock says. Stream entry ids (the group ids) also come from Redis's clock.

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
from pathlib import Path
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio.sentinel import MasterNotFoundError

from prioreplay import rules
from prioreplay.errors import FailedPrecondition, Internal, InvalidArgument, NotFound, PrioreplayError, StoreUnavailable
from prioreplay.priority_server.config import NAMESPACE_RE, ReplicationSettings
from prioreplay.priority_server.records import (
    Delivery,
    GroupOutcome,
    Lease,
    ProblemState,
    Renewal,
    ReportResult,
    SampledProblem,
    StoreStats,
)
from prioreplay.priority_server.redis_connection import RedisConnection
from prioreplay.priority_server.samplers import SAMPLERS, step_seed
from prioreplay.priority_server.snapshot import COUNTER_NAMES
from prioreplay.priority_server.store import (
    EXPIRE_LIMIT,
    TOMBSTONE_TTL_S,
    QueueWatch,
    Store,
    StoreConfig,
    conflict_error,
    histogram_edges,
    member_id,
    renew_refusal,
    same_text,
    tie_member,
)
from prioreplay.problems import MAX_NAME_BYTES, ProblemRecord
from prioreplay.redact import redact_url
from prioreplay.rules import Pool

#: Problems per register script call.
REGISTER_CHUNK = 2000
#: Consumer group of the trajectory stream.
CONSUMER_GROUP = "learners"
#: Waiting pulls that may hold a pooled connection in ``XREAD BLOCK`` at once, per store (process);
#: more wait for a free one (each pull still ends by its ``wait_s``).
MAX_BLOCKED_PULLS = 32
#: Attempts of a weighted/uniform sample when other servers keep moving the step.
STEP_RETRIES = 32

KEY_NAMES = (
    "problems",
    "stats",
    "heap",
    "solved",
    "unsolved",
    "leases",
    "deadlines",
    "tomb:reported",
    "tomb:expired",
    "counters",
    "policy",
    "stream",
    "health",
    "requests",
    "requests:due",
    "quarantine",
    "settings",
    "tokens",
    "owners",
)
_STATE_KEYS = ("stats", "heap", "solved", "unsolved", "leases", "deadlines", "counters", "tomb:reported", "tomb:expired")
#: The store's counters kept as integers (every one of the memory store's but the reward sum).
_INT_COUNTERS = tuple(name for name in COUNTER_NAMES if name != "reward_sum")
log = logging.getLogger(__name__)
_STREAM_ID_RE = re.compile(r"^\d{1,20}-\d{1,20}$")

#: How each Redis error maps to ours (``error_kind``): every kind but ``logic`` is an outage the
#: store may recover from (UNAVAILABLE, health NOT_SERVING, clients back off and retry); ``logic``
#: is an answer the server cannot use (INTERNAL, logged).
ERROR_KINDS = {
    "unreachable": "connection refused/reset/timed out, AUTH failed, Redis LOADING its data set",
    "read_only": "READONLY: a replica, or MASTERDOWN / min-replicas-to-write unmet, or WAIT counted fewer replicas "
    "than --min-replica-acks",
    "out_of_memory": "OOM: used memory over maxmemory (with maxmemory-policy noeviction)",
    "busy": "BUSY (a script over lua-time-limit), TRYAGAIN / CLUSTERDOWN (a failover)",
    "logic": "any other error answer (WRONGTYPE, a script error, NOPERM): a bug or a foreign key",
}
#: What an operator does about each outage kind (in the error message).
ERROR_FIX = {
    "read_only": "point --store at the primary (or promote this replica: REPLICAOF NO ONE)",
    "out_of_memory": "raise maxmemory or free memory (acknowledge trajectory groups, trim other data)",
    "busy": "wait for the running script or failover to finish",
}


def error_kind(e: BaseException) -> str:
    """The kind (a key of :data:`ERROR_KINDS`) of an exception from redis-py or the socket."""
    if isinstance(e, (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)):
        return "unreachable"  # includes BusyLoadingError, AuthenticationError, MaxConnectionsError
    if isinstance(e, redis_errors.OutOfMemoryError):
        return "out_of_memory"
    if isinstance(e, (redis_errors.ReadOnlyError, redis_errors.MasterDownError)):
        return "read_only"
    if isinstance(e, (redis_errors.TryAgainError, redis_errors.ClusterDownError)):
        return "busy"
    text = str(e)
    # inside a script the prefix may follow the script's own error text; match the code words
    for code, kind in (
        ("OOM ", "out_of_memory"),
        ("READONLY ", "read_only"),
        ("MASTERDOWN ", "read_only"),
        ("NOREPLICAS ", "read_only"),
        ("BUSY ", "busy"),
        ("LOADING ", "unreachable"),
    ):
        if text.startswith(code) or f" {code}" in text:
            return kind
    return "logic"


_LUA_DIR = Path(__file__).with_name("lua")
SCRIPT_NAMES = ("register", "sample", "report", "renew", "expire", "publish", "pull", "ack", "seen")
#: Scripts whose change a client is told is done: with ``min_replica_acks`` each is followed by WAIT.
#: (A lost lease of ``sample`` or a lost expiry changes nothing a client was promised: a report of
#: that lease is answered ``unknown lease``, the problems are leased again. A lost renewal leaves the
#: earlier deadline: the next renewal moves it again, or the lease expires as if its holder had died.)
WAITED_SCRIPTS = frozenset({"register", "report", "publish", "ack"})


def lua_library() -> str:
    """The shared Lua functions (``lua/lib.lua``) every script of the store is prefixed with."""
    return (_LUA_DIR / "lib.lua").read_text(encoding="utf-8")


def _load_scripts() -> dict[str, str]:
    lib = lua_library()
    return {n: lib + "\n" + (_LUA_DIR / f"{n}.lua").read_text(encoding="utf-8") for n in SCRIPT_NAMES}


_SCRIPTS = _load_scripts()


def _f(x: float) -> str:
    """A float as a string that Lua's ``tonumber`` and Redis parse back to the same double."""
    return repr(float(x))


def _s(b: bytes | str | None) -> str:
    if b is None:
        return ""
    return b.decode("utf-8") if isinstance(b, bytes) else str(b)


def _parse_stats(value: bytes | str) -> tuple[rules.Stats, Pool, float]:
    n, s1, s2, pool, score = _s(value).split(" ")
    return rules.Stats(float(n), float(s1), float(s2)), Pool(int(pool)), float(score)


_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # compact: no raw control characters


def _encode_problem(p: ProblemRecord) -> str:
    return _JSON.encode([p.prompt, p.answer, p.verifier, dict(p.metadata)])


def _decode_problem(pid: str, value: bytes | str) -> ProblemRecord:
    prompt, answer, verifier, metadata = json.loads(_s(value))
    return ProblemRecord(id=pid, prompt=prompt, answer=answer, verifier=verifier, metadata=metadata)


def _sentinel_errors(message: str) -> str:
    """``; sentinels answered: ConnectionError, ...`` from a ``MasterNotFoundError`` message (redis-py
    appends ``: <client> - <error repr>, ...`` for each sentinel that failed; the clients' settings
    are left out), or "" when every sentinel answered."""
    _, sep, rest = message.partition(" : ")
    if not sep:
        return ""
    kinds = [part.split(" - ", 1)[1].split("(", 1)[0] for part in rest.split(", ") if " - " in part]
    return f"; the sentinels' errors: {', '.join(kinds)}" if kinds else ""


class RedisStore(Store):
    """The store on Redis: durable, shared by several server processes, one round trip per change.

    Args:
        config: sampling and bookkeeping parameters (must match across servers of one run).
        url: ``redis://[:password@]host:port/db`` (or ``rediss://``, ``unix://``), or
            ``redis+sentinel://host:port[,host:port]/service_name[/db]`` (the primary Sentinel names,
            followed through failovers; :mod:`.redis_connection`).
        namespace: the run's name; 1–MAX_NAME_BYTES (128) characters of ``[A-Za-z0-9_.:-]`` (no
            braces: it is the hash tag).
        clock: unix seconds; injected for deterministic tests.
        replication: with ``min_replica_acks`` N > 0, each script of :data:`WAITED_SCRIPTS` is
            followed by ``WAIT N timeout`` on its connection, and a shortfall raises
            StoreUnavailable (kind ``read_only``; the change is applied on the primary but not known
            to survive a failover: a retry is answered as for a lost answer).

    Raises:
        InvalidArgument: a malformed URL or namespace, or a sampler without a Lua branch.
        StoreUnavailable: (from every method) Redis cannot be reached, is read-only, out of memory
            or busy (``kind``, :func:`error_kind`); the message carries the URL with its password
            redacted and the fix. Nothing was changed (each change is one script).
        Internal: (from every method) Redis answered another error (WRONGTYPE, a script error).
    """

    def __init__(
        self,
        config: StoreConfig,
        url: str,
        namespace: str = "default",
        clock: Callable[[], float] = time.time,
        replication: ReplicationSettings | None = None,
    ):
        super().__init__(config, clock)
        if not NAMESPACE_RE.match(namespace or ""):
            raise InvalidArgument(
                f"namespace ({namespace!r}) must be 1-{MAX_NAME_BYTES} characters of letters, digits, '_', '.', ':' or '-'"
            )
        self._sampler = SAMPLERS[config.sampler]
        if self._sampler.lua_branch is None:
            raise InvalidArgument(f"sampler {config.sampler!r} runs in the memory store only; use --store memory")
        self.namespace = namespace
        self.redacted_url = redact_url(url)
        self._connection = RedisConnection(url)
        self._r = self._connection.client
        self._sentinels_reset_at = 0.0  # monotonic seconds of the last reset_sentinels()
        self._replication = replication or ReplicationSettings()
        self._scripts = {name: self._r.register_script(src) for name, src in _SCRIPTS.items()}
        self._keys = {name: self.key(name) for name in KEY_NAMES}
        self._state_keys = [self._keys[n] for n in _STATE_KEYS]
        self._step_hint: int | None = None
        self._health_error = ""
        p = config.params
        self._bands = config.bands
        self._params_args = [
            _f(p.decay),
            _f(p.prior_alpha),
            _f(p.prior_beta),
            _f(self._bands.solved_at),
            _f(self._bands.unsolved_at),
        ]
        self._initial_priority = rules.priority(rules.Stats(), p)
        self._blocked_pulls = asyncio.Semaphore(MAX_BLOCKED_PULLS)

    def key(self, name: str) -> str:
        """The Redis key of ``name`` in this run: ``prioreplay:{<namespace>}:<name>``."""
        return f"prioreplay:{{{self.namespace}}}:{name}"

    # -- plumbing -------------------------------------------------------------------------
    def _unavailable(self, e: Exception) -> StoreUnavailable:
        if isinstance(e, MasterNotFoundError):  # redis-py's message repeats every sentinel client's settings
            asked = _sentinel_errors(str(e))
            return StoreUnavailable(
                f"Redis at {self.redacted_url} is unreachable: no sentinel names a primary that is up (a failover "
                f"in progress, or no sentinel answers{asked}); wait for the promotion or check the sentinels, then retry"
            )
        return StoreUnavailable(
            f"Redis at {self.redacted_url} is unreachable ({type(e).__name__}: {e}); "
            "check that Redis runs and the URL is right, then retry"
        )

    def _error(self, e: Exception) -> PrioreplayError:
        """Our error for a Redis error (the one place every Redis call goes through; see :data:`ERROR_KINDS`)."""
        kind = error_kind(e)
        if kind == "unreachable":
            return self._unavailable(e)
        if kind == "logic":
            return Internal(f"Redis at {self.redacted_url} answered {type(e).__name__}: {e}")
        return StoreUnavailable(
            f"Redis at {self.redacted_url} is {kind.replace('_', ' ')} ({e}); {ERROR_FIX[kind]}, then retry", kind=kind
        )

    async def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if self._replication.min_replica_acks and name in WAITED_SCRIPTS:

            async def fill(pipe):
                await self._scripts[name](keys=list(keys), args=list(args), client=pipe)
                self._wait(pipe)

            res, acks = await self._pipe(fill, transaction=False)
            self._check_acks(name, acks)
            return res
        try:
            return await self._scripts[name](keys=list(keys), args=list(args))
        except (redis_errors.RedisError, OSError) as e:
            await self._after_error(e)
            raise self._error(e) from None

    async def _after_error(self, e: BaseException) -> None:
        """After no sentinel named a primary, the sentinels' pooled connections are dropped (at most
        once a second), so the next call discovers the primary over new ones
        (:meth:`RedisConnection.reset_sentinels`)."""
        if isinstance(e, MasterNotFoundError) and time.monotonic() - self._sentinels_reset_at >= 1.0:
            self._sentinels_reset_at = time.monotonic()
            try:
                await self._connection.reset_sentinels()
            except Exception as reset_error:  # noqa: BLE001 - the call's own error is the one to report
                log.warning("resetting the sentinel connections failed: %s", reset_error)

    def _wait(self, pipe) -> Any:
        """Queue ``WAIT min_replica_acks timeout`` (on the pipeline's one connection, after its writes);
        returns the pipeline, as its queued commands do."""
        return pipe.execute_command("WAIT", self._replication.min_replica_acks, self._replication.min_replica_acks_timeout_ms)

    def _check_acks(self, what: str, acks: Any) -> None:
        """Raise StoreUnavailable (kind ``read_only``) when WAIT counted fewer than ``min_replica_acks`` replicas."""
        want, ms = self._replication.min_replica_acks, self._replication.min_replica_acks_timeout_ms
        if int(acks) < want:
            raise StoreUnavailable(
                f"Redis at {self.redacted_url}: {what} was acknowledged by {int(acks)} of the {want} replicas "
                f"--min-replica-acks asks for within {ms} ms, so it may not survive a failover; check the replicas "
                "(INFO replication), raise --min-replica-acks-timeout-ms or lower --min-replica-acks, then retry",
                kind="read_only",
            )

    async def _do(self, coro) -> Any:
        try:
            return await coro
        except (redis_errors.RedisError, OSError) as e:
            await self._after_error(e)
            raise self._error(e) from None

    async def _pipe(self, fill: Callable[[Any], Any], transaction: bool = True) -> list:
        """Run the commands ``fill(pipe)`` queues (it may be a coroutine function) in one round trip."""

        async def go():
            async with self._r.pipeline(transaction=transaction) as pipe:
                queued = fill(pipe)
                if hasattr(queued, "__await__"):
                    await queued
                return await pipe.execute()

        return await self._do(go())

    # -- run settings ---------------------------------------------------------------------
    async def _claim_settings(self, wanted: dict) -> dict:
        key = self._keys["settings"]
        _, stored = await self._pipe(lambda p: (p.set(key, json.dumps(wanted, sort_keys=True), nx=True), p.get(key)))
        return json.loads(_s(stored))

    async def _put_settings(self, wanted: dict) -> None:
        await self._do(self._r.set(self._keys["settings"], json.dumps(wanted, sort_keys=True)))

    # -- problems -------------------------------------------------------------------------
    async def _count_problems(self) -> int:
        return int(await self._do(self._r.hlen(self._keys["problems"])))

    async def _register(self, problems: list[ProblemRecord], replace: bool) -> tuple[int, int, int]:
        seed = self.config.seed
        keys = [
            self._keys["stats"],
            self._keys["heap"],
            self._keys["problems"],
            self._keys["solved"],
            self._keys["unsolved"],
            self._keys["quarantine"],
        ]
        prio = _f(self._initial_priority)
        head = [f"0 0 0 {int(Pool.HEAP)} {prio}", prio]
        script = self._scripts["register"]
        if not replace and len(problems) > REGISTER_CHUNK:
            await self._refuse_clashes(problems)  # each script checks its own chunk; the call is several

        async def fill(pipe):
            for start in range(0, len(problems), REGISTER_CHUNK):
                chunk = "\n".join(
                    f"{p.id}\t{tie_member(p.id, seed)}\t{_encode_problem(p)}" for p in problems[start : start + REGISTER_CHUNK]
                )
                await script(keys=keys, args=[*head, chunk, int(replace)], client=pipe)
            pipe.hlen(self._keys["problems"])
            if self._replication.min_replica_acks:
                self._wait(pipe)

        res = await self._pipe(fill, transaction=False)
        if self._replication.min_replica_acks:
            self._check_acks("register", res.pop())
        clashes = [_s(pid) for r in res[:-1] if int(r[0]) == -1 for pid in r[1:]]
        if clashes:  # only a registration racing another one gets here with several chunks
            raise conflict_error(clashes)
        created = sum(int(r[0]) for r in res[:-1])
        updated = sum(int(r[1]) for r in res[:-1])
        return created, updated, int(res[-1])

    async def _refuse_clashes(self, problems: list[ProblemRecord]) -> None:
        """Raise :func:`conflict_error` when a registered id holds another prompt or answer (one read)."""
        stored = await self._do(self._r.hmget(self._keys["problems"], [p.id for p in problems]))
        clashes = [
            p.id for p, v in zip(problems, stored, strict=True) if v is not None and not same_text(_decode_problem(p.id, v), p)
        ]
        if clashes:
            raise conflict_error(clashes)

    # -- leases ---------------------------------------------------------------------------
    async def _sample(self, batch_size: int, lease_timeout_s: float, request_id: str = "", worker_id: str = "") -> Lease:
        cfg = self.config
        now = float(self.clock())
        deadline = now + lease_timeout_s
        lease_id = secrets.token_hex(16)
        rate = batch_size * cfg.retest_fraction if self._sampler.retests else 0.0  # samplers.retest_quota, in Lua
        keys = self._state_keys + [
            self._keys["problems"],
            self._keys["policy"],
            self._keys["requests"],
            self._keys["requests:due"],
            self._keys["tokens"],
            self._keys["owners"],
        ]
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
                [
                    _f(now),
                    batch_size,
                    _f(deadline),
                    lease_id,
                    self._sampler.lua_branch,
                    _f(rate),
                    cfg.retest_interval,
                    _f(cfg.alpha),
                    expected,
                    seed32,
                    EXPIRE_LIMIT,
                    _f(TOMBSTONE_TTL_S),
                    _f(cfg.gumbel_temperature),
                    _f(cfg.posterior_decay),
                    _f(cfg.posterior_prior),
                    cfg.probe_size,
                    int(getattr(self._sampler.memory, "probe_unseen", False)),
                    int(getattr(self._sampler.memory, "probe_retests", False)),
                    request_id,
                    cfg.mean_group_size,
                    cfg.max_group_size,
                    _f(cfg.params.prior_alpha),
                    _f(cfg.params.prior_beta),
                    cfg.retest_versions,
                    worker_id,
                ],
            )
            if res[0] == b"SAME":  # a retried request: its live lease again
                lease_id, deadline = _s(res[-2]), float(res[-1])
                break
            if res[0] == b"STEP":
                self._step_hint = int(res[1])
                continue
            break
        else:
            raise StoreUnavailable(f"sample: the step kept moving under {STEP_RETRIES} attempts; retry")
        return self._lease(res, batch_size, now, lease_id, deadline)

    def _lease(self, res: list, batch_size: int, now: float, lease_id: str, deadline: float) -> Lease:
        """The :class:`Lease` of a ``sample.lua`` answer ``res`` (``OK`` or ``SAME``) for a request of
        ``batch_size`` at ``now``; a short batch gets a retry hint, an empty one no lease id."""
        step, version, uri = int(res[1]), int(res[2]), _s(res[3])
        if res[0] != b"SAME":  # a replayed lease carries its own (older) step
            self._step_hint = step
        earliest = [float(res[4])] if res[4] else []
        problems = self._decode_picks(res, int(res[5]))
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

    def _decode_picks(self, res: list, n: int) -> list[SampledProblem]:
        """The ``n`` leased problems of a ``sample.lua`` answer: five slots each from index 6
        (member, source pool, statistics value, problem record, group size or 0)."""
        problems: list[SampledProblem] = []
        for i in range(6, 6 + 5 * n, 5):
            member, source, stats_value, record = _s(res[i]), int(res[i + 1]), res[i + 2], res[i + 3]
            group_size = int(res[i + 4]) or None
            pid = member_id(member)
            stats, _, score = _parse_stats(stats_value)
            problems.append(
                SampledProblem(
                    problem=_decode_problem(pid, record),
                    priority=score if source == Pool.HEAP else rules.priority(stats, self.config.params),
                    source=Pool(source),
                    group_size=group_size,
                )
            )
        return problems

    async def _report(
        self, lease_id: str, outcomes: list[GroupOutcome], unservable: Sequence[str] = (), more_parts: bool = False
    ) -> ReportResult:
        seed = self.config.seed
        args: list[Any] = [
            _f(self.clock()),
            lease_id,
            int(more_parts),
            CONSUMER_GROUP,
            *self._params_args,
            self.config.retest_versions,
            len(outcomes),
        ]
        kinds = []
        for o in outcomes:
            rewards = [float(r) for r in o.rewards]
            kinds.append(rules.classify(rewards))
            sr, sq = rules.reward_sums(rewards)
            # the script counts a forgetting event / breakthrough when the problem came from the
            # solved / unsolved pool: send whether it would be one
            forgetting = rules.is_forgetting(Pool.SOLVED, rewards, self._bands)
            breakthrough = rules.is_breakthrough(Pool.UNSOLVED, rewards, self._bands)
            args += [
                f"{tie_member(o.problem_id, seed)}\t{kinds[-1].value}\t{len(rewards)}\t"
                f"{_f(sr)}\t{_f(sq)}\t{int(forgetting)}\t{int(breakthrough)}\t{max(0, int(o.completion_tokens))}",
                bytes(o.payload),
            ]
        args += [len(unservable), *(tie_member(pid, seed) for pid in unservable)]
        res = await self._run(
            "report",
            self._state_keys
            + [
                self._keys["stream"],
                self.key(f"parts:{lease_id}"),
                self._keys["quarantine"],
                self._keys["tokens"],
                self._keys["policy"],
                self._keys["owners"],
            ],
            args,
        )
        status = int(res[0])
        if status == 0:
            return ReportResult(accepted=False, reason=_s(res[1]))
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
        now = float(self.clock())
        keys = self._state_keys + [
            self._keys["owners"],
            self._keys["requests"],
            self._keys["requests:due"],
            self.key(f"parts:{lease_id}"),
        ]
        res = await self._run("renew", keys, [_f(now), lease_id, worker_id, _f(now + lease_timeout_s)])
        status = int(res[0])
        if status == 0:
            raise renew_refusal(lease_id, _s(res[1]))
        if status == -1:
            raise renew_refusal(lease_id, "another worker", worker_id, _s(res[1]))
        return Renewal(float(res[1]), int(res[2]))

    async def _expire_leases(self, limit: int) -> int:
        if limit < 1:
            return 0
        keys = self._state_keys + [self._keys["owners"]]
        return int(await self._run("expire", keys, [_f(self.clock()), limit, _f(TOMBSTONE_TTL_S)]))

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
        args = [CONSUMER_GROUP, consumer, max_groups, int(include_own_pending), min_idle_ms, int(watch)]
        res = await self._run("pull", [self._keys["stream"]], args)
        w = None
        if watch:
            idle_ms = int(res[-1])
            w = QueueWatch(_s(res[-2]), idle_ms / 1000.0 if idle_ms >= 0 else math.inf)
            res = res[:-2]
        out = [
            Delivery(group_id=_s(res[i]), payload=bytes(res[i + 1]), delivery_count=int(res[i + 2]))
            for i in range(0, len(res), 3)
        ]
        return out, w

    async def _wait_queued(self, watch: QueueWatch, timeout_s: float) -> None:
        """``XREAD BLOCK`` from the consumer group's last-delivered id: Redis answers at the next
        ``XADD`` of a report (any process, any replica's clients) or after ``timeout_s``. At most
        :data:`MAX_BLOCKED_PULLS` pulls hold a pooled connection blocked at once.

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
            block_ms = int((deadline - time.monotonic()) * 1000)
            if block_ms >= 1:  # BLOCK 0 would block for ever
                await self._do(self._r.xread({self._keys["stream"]: watch.mark}, count=1, block=block_ms))
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
        return int(await self._run("ack", [self._keys["stream"], self._keys["counters"]], [CONSUMER_GROUP, *ids]))

    # -- policy ---------------------------------------------------------------------------
    async def _publish(self, version: int, weights_uri: str) -> tuple[int, str]:
        res = await self._run("publish", [self._keys["policy"]], [version, weights_uri])
        status, cur_v, cur_uri = int(res[0]), int(res[1]), _s(res[2])
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
        return int(v or 0), _s(uri)

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

        def fill(p):
            p.hlen(k["problems"])
            p.zcard(k["heap"])
            p.zcard(k["solved"])
            p.zcard(k["unsolved"])
            p.hlen(k["leases"])
            p.hgetall(k["counters"])
            p.hmget(k["policy"], "version", "uri")
            p.hlen(k["quarantine"])
            for i in range(histogram_buckets):
                hi = _f(edges[i + 1]) if i == histogram_buckets - 1 else "(" + _f(edges[i + 1])
                p.zcount(k["heap"], _f(edges[i]) if i else "-inf", hi)

        res = await self._pipe(fill)
        problems, heap, solved, unsolved, leases, counters, (ver, uri), quarantined = res[:8]
        c = {_s(a): _s(b) for a, b in counters.items()}
        if "problems_seen" not in c and int(problems):  # a namespace older than the counter: count once
            c["problems_seen"] = await self._run("seen", [k["counters"], k["stats"]], [])
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
            weights_uri=_s(uri),
            priority_histogram=[int(x) for x in res[8:]],
            priority_bucket_edges=edges,
            reward_sum=float(c.get("reward_sum", 0.0)),
            queue_depth=queue_depth,
            pending_groups=pending,
            unseen=max(0, int(problems) - int(c.get("problems_seen", 0))),
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
        stats, pool, score = _parse_stats(stats_value)
        return ProblemState(
            problem=_decode_problem(problem_id, record),
            stats=stats,
            pool=pool,
            score=score,
            priority=rules.priority(stats, self.config.params),
        )

    async def dump(self) -> dict:
        """Canonical state (see :meth:`Store.dump`); reads everything, for tests and debugging."""
        k = self._keys
        stats, counters, step_policy, leases = await self._pipe(
            lambda p: (
                p.hgetall(k["stats"]),
                p.hgetall(k["counters"]),
                p.hmget(k["policy"], "version", "uri"),
                p.hvals(k["leases"]),
            )
        )
        problems = {}
        for pid, value in stats.items():
            st, pool, score = _parse_stats(value)
            problems[_s(pid)] = (int(pool), st.n, st.s1, st.s2, score)
        c = {_s(a): _s(b) for a, b in counters.items()}
        out_counters: dict[str, float | int] = {name: int(c.get(name, 0)) for name in _INT_COUNTERS}
        out_counters["reward_sum"] = float(c.get("reward_sum", 0.0))
        lease_lists = sorted(sorted(member_id(f) for f in _s(rec).split("\t")[2::3]) for rec in leases)
        return {
            "problems": problems,
            "counters": out_counters,
            "step": int(c.get("step", 0)),
            "policy": (int(step_policy[0] or 0), _s(step_policy[1])),
            "leases": lease_lists,
            "queue": await self._undelivered(),
        }

    async def _undelivered(self) -> list[bytes]:
        k = self._keys["stream"]
        if not await self._do(self._r.exists(k)):
            return []
        groups = await self._do(self._r.xinfo_groups(k))
        last = next(_s(g["last-delivered-id"]) for g in groups if _s(g["name"]) == CONSUMER_GROUP)
        entries = await self._do(self._r.xrange(k, min="(" + last, max="+"))
        return [bytes(fields[b"p"]) for _, fields in entries]

    # -- lifecycle ------------------------------------------------------------------------
    async def healthy(self) -> bool:
        """True when Redis accepts a write: a small ``SET`` with a 60 s expiry (key ``health``).

        PING alone answers while Redis refuses every write (out of memory, a read-only
        replica), so the probe writes; the reason of a failure is logged once per change.
        """
        try:
            if self._replication.min_replica_acks:
                _, acks = await self._pipe(
                    lambda p: (p.set(self._keys["health"], _f(self.clock()), px=60_000), self._wait(p)), transaction=False
                )
                self._check_acks("the health probe", acks)
            else:
                await self._do(self._r.set(self._keys["health"], _f(self.clock()), px=60_000))
        except PrioreplayError as e:
            reason = str(e)
            if reason != self._health_error:
                log.warning("store health check failed: %s", reason)
            self._health_error = reason
            return False
        if self._health_error:
            log.info("Redis at %s accepts writes again", self.redacted_url)
        self._health_error = ""
        return True

    async def close(self) -> None:
        """Close the connection pool (and the connections to the sentinels)."""
        await self._connection.aclose()
