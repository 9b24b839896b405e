"""The production store: Redis (redis-py asyncio, hiredis parser) with one Lua script per change.

Semantics are those of :mod:`prioreplay.priority_server.store.base` (module docstring), bit for bit
equal to the in-process ``MemoryStore`` for the same seed, clock readings and operations (with a
clock injected into both: see "Time").

The key schema and the values' formats are in :mod:`.keys`; the error taxonomy in :mod:`.errors`;
the scripts and their declared arguments in :mod:`.scripts`; the records and replies they exchange
in :mod:`.layouts`. The store is composed by concept: the script runner and connection
(:class:`.client.RedisClient`), the learner's queue (:class:`.queue.RedisQueue`), the read-only
views (:class:`.inspection.RedisInspection`), and here the problems' life: register, sample,
report, renew, expire, publish.

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

import json
import logging
import math
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from prioreplay import rules
from prioreplay.errors import FailedPrecondition, InvalidArgument, StoreUnavailable
from prioreplay.problems import ProblemRecord
from prioreplay.rules import Pool

from ...config import ReplicationSettings, StoreConfig
from ...samplers import SAMPLERS, step_seed
from ..contract import (
    conflict_error,
    member_id,
    renew_refusal,
    same_text,
    tie_member,
)
from ..records import (
    GroupOutcome,
    Lease,
    Renewal,
    ReportResult,
    SampledProblem,
)
from .client import WAIT_REPLIES
from .inspection import RedisInspection
from .keys import decode_problem, encode_problem, float_arg, parse_stats, text, warm_arg
from .layouts import (
    OUTCOME,
    PACE_REPLY,
    REPORT_NOT_LIVE,
    REPORT_OUTCOME_NOT_LEASED,
    REPORT_REPLY,
    REPORT_UNSERVABLE_NOT_LEASED,
    SAME_REPLY,
    SAMPLE_REPLY,
)
from .pace import RedisPace, pace_args
from .queue import CONSUMER_GROUP
from .scripts import SCRIPT_ARGS, report_run, sample_run

REGISTER, SAMPLE, REPORT, RENEW = (SCRIPT_ARGS[n] for n in ("register", "sample", "report", "renew"))
EXPIRE, PULL, ACK, PUBLISH, SEEN = (SCRIPT_ARGS[n] for n in ("expire", "pull", "ack", "publish", "seen"))
#: Problems per register script call.
REGISTER_CHUNK = 2000
#: Attempts of a weighted/uniform sample when other servers keep moving the step.
STEP_RETRIES = 32
log = logging.getLogger(__name__)


class RedisStore(RedisInspection):
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
                lease_id = text(SAME_REPLY.tail_of(res)["lease_id"])
                break
            if res[0] == b"STEP":
                self._step_hint = int(res[1])
                continue
            if res[0] == b"PACE":  # no room under the pace bound (base.py, "sample" 1b)
                at = PACE_REPLY.at
                earliest = res[at("earliest")]
                wait_s = float(earliest) - float(res[at("now")]) if earliest else math.inf
                return self.pace_refusal(int(res[at("version")]), text(res[at("uri")]), int(res[at("step")]), wait_s)
            break
        else:
            raise StoreUnavailable(f"sample: the step kept moving under {STEP_RETRIES} attempts; retry")
        tail = SAMPLE_REPLY.tail_of(res)
        return self._lease(res, batch_size, float(tail["now"]), lease_id, float(tail["deadline"]))

    def _lease(self, res: list, batch_size: int, now: float, lease_id: str, deadline: float) -> Lease:
        """The :class:`Lease` of a ``sample.lua`` answer ``res`` (``OK`` or ``SAME``) for a request of
        ``batch_size`` at ``now`` (the script's clock reading) with deadline ``deadline``; a short
        batch gets a retry hint, an empty one no lease id."""
        at = SAMPLE_REPLY.at
        step, version, uri = int(res[at("step")]), int(res[at("version")]), text(res[at("uri")])
        if res[0] != b"SAME":  # a replayed lease carries its own (older) step
            self._step_hint = step
        earliest = [float(res[at("earliest")])] if res[at("earliest")] else []
        problems = self._decode_picks(res, int(res[at("n")]), version)
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
        """The ``n`` leased problems of a ``sample.lua`` answer at policy ``version``
        (:data:`.layouts.SAMPLE_REPLY`: per problem member, source pool, statistics value, problem
        record, group size or 0; ``omega_unseen``, the priority of a problem from the heap's unseen band)."""
        problems: list[SampledProblem] = []
        unseen = float(res[SAMPLE_REPLY.at("omega_unseen")])
        for pick in SAMPLE_REPLY.items(res, n):
            source = Pool(int(pick["source"]))
            stats, _, score = parse_stats(pick["stats"])
            prio = self.leased_priority(source, score, stats, version, unseen)
            problem = decode_problem(member_id(text(pick["member"])), pick["problem"])
            problems.append(SampledProblem(problem, prio, source, int(pick["group_size"]) or None))
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
            # solved / unsolved pool: send whether it would be one (rules.retest_event)
            verdict = rules.destination(kinds[-1], sr / len(rewards), self._bands)
            forgetting = rules.retest_event(Pool.SOLVED, verdict) == "forgetting"
            breakthrough = rules.retest_event(Pool.UNSOLVED, verdict) == "breakthrough"
            record = OUTCOME.pack(
                member=tie_member(o.problem_id, seed),
                kind=kinds[-1].value,
                group_size=len(rewards),
                sum_r=float_arg(sr),
                sum_r2=float_arg(sq),
                forgetting=int(forgetting),
                breakthrough=int(breakthrough),
                tokens=max(0, int(o.completion_tokens)),
                evidence=rules.evidence_groups(len(rewards), self.config.pool_evidence),
            )
            rest += [record, bytes(o.payload)]
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
        if status == REPORT_NOT_LIVE:
            return ReportResult(accepted=False, reason=text(res[1]))
        if status == REPORT_OUTCOME_NOT_LEASED:
            j = int(res[1])
            raise InvalidArgument(
                f"outcomes[{j}]: problem {outcomes[j].problem_id!r} is not in lease {lease_id}; "
                "report only the problems that lease returned"
            )
        if status == REPORT_UNSERVABLE_NOT_LEASED:
            j = int(res[1])
            raise InvalidArgument(
                f"unservable[{j}]: problem {unservable[j]!r} is not in lease {lease_id}; "
                "report only the problems that lease returned"
            )
        at = REPORT_REPLY.at
        return ReportResult(
            accepted=True,
            groups_queued=int(res[at("queued")]),
            groups_filtered=int(res[at("filtered")]),
            skipped=int(res[at("skipped")]),
            quarantined=int(res[at("quarantined")]),
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
