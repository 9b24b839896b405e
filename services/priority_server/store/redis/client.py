"""The Redis store's plumbing: the connection, the scripts, the keys of a run, and the one path every
Redis call goes through (errors mapped by :mod:`.errors`; ``WAIT`` for replica acknowledgements, as
many as :mod:`.replicas` counts),
the namespace identity (claimed at start, checked by every script, by the health probe and by
``stats``: :mod:`..identity`, with the keys a namespace must hold), Redis's ``maxmemory-policy``
(refused at start and, found by the health probe, while it deletes keys), plus the health probe
and close. :class:`~.store.RedisStore` adds
the store's operations."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio.sentinel import MasterNotFoundError

from prioreplay.errors import FailedPrecondition, InvalidArgument, PrioreplayError, StoreUnavailable
from prioreplay.problems import MAX_NAME_BYTES
from prioreplay.redact import redact_url

from ...config import NAMESPACE_RE, ReplicationSettings, StoreConfig
from ..base import Store
from ..contract import run_settings
from ..identity import ACCEPT_FLAG, MUST_HOLD, Identity, LossMarker, NamespaceLost, assess, missing_keys, startup_refusal
from ..records import StoreStats
from .connection import RedisConnection
from .errors import eviction_error, store_error
from .keys import KEY_NAMES, float_arg, redis_key, text
from .replicas import ReplicaTarget
from .scripts import CHECK_KEYS, SCRIPT_ARGS, SCRIPTS, WAITED_SCRIPTS

log = logging.getLogger(__name__)
#: The error reply of the namespace check (``lua/namespace_check.lua``).
NAMESPACE_CHANGED = "NAMESPACE_CHANGED"
CLAIM = SCRIPT_ARGS["claim"]
#: Replies :meth:`RedisClient._wait` adds to a pipeline: the small write's, WAIT's count, ``INFO replication``.
WAIT_REPLIES = 3


def namespace_changed(e: BaseException) -> bool:
    """Whether a Redis error is the namespace check's refusal (also inside a pipeline's error text)."""
    return isinstance(e, redis_errors.ResponseError) and NAMESPACE_CHANGED in str(e)


class RedisClient(Store):
    """A :class:`Store` on one Redis run ``namespace`` (arguments as :class:`~.store.RedisStore`).

    Raises:
        InvalidArgument: a malformed URL or namespace.
    """

    def __init__(
        self,
        config: StoreConfig,
        url: str,
        namespace: str = "default",
        clock: Callable[[], float] | None = None,
        replication: ReplicationSettings | None = None,
    ):
        super().__init__(config, clock or time.time)
        #: A test's injected lease clock (None: Redis's own, ``TIME`` in the scripts; see ``RedisStore``).
        self._lease_clock = clock
        if not NAMESPACE_RE.match(namespace or ""):
            raise InvalidArgument(
                f"namespace ({namespace!r}) must be 1-{MAX_NAME_BYTES} characters of letters, digits, '_', '.', ':' or '-'"
            )
        self.namespace = namespace
        self.redacted_url = redact_url(url)
        self._connection = RedisConnection(url)
        self._r = self._connection.client
        self._sentinels_reset_at = 0.0  # monotonic seconds of the last reset_sentinels()
        self._replication = replication or ReplicationSettings()
        self._replicas = ReplicaTarget(self._connection, self._replication)
        self._scripts = {name: self._r.register_script(src) for name, src in SCRIPTS.items()}
        self._keys = {name: self.key(name) for name in KEY_NAMES}
        self._health_error = ""
        #: The identity this server claimed (:meth:`claim_namespace`); None before: no check.
        self.identity: Identity | None = None
        #: True once this server claimed the namespace and its settings: from then on the scripts and
        #: :meth:`check_namespace` check the identity and the keys it must hold (:func:`..identity.missing_keys`).
        self._claimed = False
        #: While Redis's ``maxmemory-policy`` deletes keys (found at start or by the health probe):
        #: why, and the fix; every script and ``stats`` answer StoreUnavailable (kind ``evicting``).
        self.evicting = ""
        self._policy_unread = ""  # why CONFIG GET was refused (warned about once)

    def key(self, name: str) -> str:
        """The Redis key of ``name`` in this run: ``prioreplay:{<namespace>}:<name>``."""
        return redis_key(self.namespace, name)

    # -- plumbing -------------------------------------------------------------------------
    def _error(self, e: Exception) -> PrioreplayError:
        """Our error for a Redis error (the one place every Redis call goes through; :func:`.errors.store_error`).

        The namespace check's refusal is :attr:`namespace_lost` (a fresh copy), or, when the
        identity read after it was a reset this server now follows (or the data came back),
        StoreUnavailable: retry.
        """
        if namespace_changed(e):
            if self.namespace_lost is not None:
                return self.namespace_lost.copy()
            return StoreUnavailable(
                f"namespace {self.namespace!r} in Redis at {self.redacted_url} changed during this call "
                f"(now {self.identity}); retry",
                kind="busy",
            )
        return store_error(e, self.redacted_url)

    # -- namespace identity ---------------------------------------------------------------
    async def claim_namespace(self, accept_loss: bool = False) -> str:
        """Claim the namespace's identity with ``lua/claim.lua`` (see ``Store.claim_namespace``).

        Raises:
            FailedPrecondition: a loss marker names another identity and ``accept_loss`` is false
                (:func:`..identity.startup_refusal`), or the identity key holds a malformed value.
            StoreUnavailable: Redis cannot be reached, or fewer replicas than ``min_replica_acks``
                acknowledged the claim (the server claims again before the first RPC).
        """
        settings = json.dumps(run_settings(self.config), sort_keys=True)
        keys, args = self._script_call(
            CLAIM.key_list(self._keys),
            CLAIM.arg_list(run_id=secrets.token_hex(8), accept_loss=int(accept_loss), settings=settings),
            check=False,
        )
        script = self._scripts["claim"]
        want = await self._replicas.wanted()
        if want:  # a failover right after a creation keeps the identity

            async def fill(pipe):
                await script(keys=keys, args=args, client=pipe)
                self._wait(pipe, want)

            res, *tail = await self._pipe(fill, transaction=False)
            await self._check_acks("the namespace claim", tail, want)
        else:
            res = await self._do(script(keys=keys, args=args))
        status, stored, marker_text = text(res[0]), text(res[1]), text(res[2])
        where = f"Redis at {self.redacted_url}"
        marker = LossMarker.parse(marker_text) if marker_text else None
        if status == "LOST":
            assert marker is not None  # claim.lua answers LOST only with a marker
            raise startup_refusal(self.namespace, where, Identity.parse(stored), marker)
        identity = Identity.parse(stored)
        if identity is None:
            raise FailedPrecondition(
                f"namespace {self.namespace!r} in {where}: key {self._keys['identity']!r} holds {stored!r}, not "
                "'<generation>:<run id>' (written by someone else); restore it, or delete it and start again"
            )
        self.identity, self.namespace_lost = identity, None
        lost = f"{Identity.parse(marker.identity) or 'an unreadable identity'} ({marker.how})" if marker else ""
        line = {
            "CREATED": f"namespace {self.namespace!r}: created as {identity}",
            "ADOPTED": f"namespace {self.namespace!r}: made before namespace identities; it is now {identity}",
            "JOINED": f"namespace {self.namespace!r}: serving {identity}",
            "RESTORED": f"namespace {self.namespace!r}: the lost {identity} is back (restored); loss marker deleted",
            "ACCEPTED": f"namespace {self.namespace!r}: {ACCEPT_FLAG}: the loss of {lost} is accepted; going on from "
            f"what Redis holds now as {identity}",
        }[status]
        (log.info if status in ("CREATED", "JOINED") else log.warning)("%s", line)
        return line

    async def check_namespace(self) -> None:
        """Read the stored identity and loss marker and compare them with the claimed identity
        (:func:`..identity.assess`): the same one clears :attr:`namespace_lost` (and deletes a marker
        naming it: the data came back); a newer generation (a reset by another server) is followed;
        anything else sets :attr:`namespace_lost` and writes the loss marker (``SET NX``: the first
        server's stays). Once the settings are claimed, the claimed identity without a key it must
        hold is lost too (``incomplete``, :func:`..identity.missing_keys`). No-op before the claim.

        Raises:
            StoreUnavailable: Redis cannot be reached.
        """
        if self.identity is None:
            return
        k = self._keys

        async def reads():
            async with self._r.pipeline(transaction=False) as p:
                p.get(k["identity"])
                p.get(k["lost"])
                for name in MUST_HOLD:
                    p.exists(k[name])
                p.hlen(k["problems"])
                p.hlen(k["stats"])
                p.zcard(k["heap"])
                return await p.execute(raise_on_error=False)

        found_text, marker_text, *counts = await self._do(reads())
        for answer in (found_text, marker_text):
            if isinstance(answer, Exception):
                raise self._error(answer)
        found, marker = Identity.parse(found_text), LossMarker.parse(marker_text)
        how = assess(self.identity, found, marker)
        exists = {name: bool(n) for name, n in zip(MUST_HOLD, counts, strict=False)}
        # a count that failed (WRONGTYPE: a key written by someone else) is a logic error, which the
        # scripts answer INTERNAL; it is not taken for a missing key
        counted = how == "same" and self._claimed and not any(isinstance(n, Exception) for n in counts)
        missing = missing_keys(exists, *counts[len(MUST_HOLD) :]) if counted else []
        if missing:
            how = "incomplete"
        if how in ("same", "newer"):
            if how == "newer":
                log.warning(
                    "namespace %r was reset by another server (%s): this server served %s and follows it now",
                    self.namespace,
                    found,
                    self.identity,
                )
                self.identity = found
            elif marker is not None:  # it names this identity: the data came back
                await self._do(self._r.delete(k["lost"]))
            if self.namespace_lost is not None:
                log.warning("namespace %r: serving %s again", self.namespace, self.identity)
            self.namespace_lost = None
            return
        lost = NamespaceLost(self.namespace, f"Redis at {self.redacted_url}", self.identity, found, how, marker, tuple(missing))
        if self.namespace_lost is None or str(self.namespace_lost) != str(lost):
            if self.namespace_lost is None:
                self.namespace_losses += 1
            log.error("%s", lost)
        self.namespace_lost = lost
        if marker is None:
            mark = LossMarker(self.identity.encode(), text(found_text), how, float(self.clock()))
            await self._do(self._r.set(k["lost"], mark.encode(), nx=True))

    def _now_arg(self) -> str:
        """ARGV ``now`` of the lease scripts: "" (they read Redis's clock, ``TIME``), or the injected
        test clock's reading."""
        return "" if self._lease_clock is None else float_arg(self._lease_clock())

    def _script_call(self, keys: Sequence[str], args: Sequence[Any], check: bool = True) -> tuple[list[str], list[Any]]:
        """A script's KEYS and ARGV with the namespace check's in front (:data:`.scripts.CHECK_KEYS`,
        then the claimed identity: "" before the claims of the namespace and its settings, or with
        ``check`` false, for no check)."""
        claimed = self.identity.encode() if check and self._claimed and self.identity is not None else ""
        return [*(self._keys[k] for k in CHECK_KEYS), *keys], [claimed, *args]

    async def claim_settings(self, accept_changes: bool = False) -> dict[str, tuple]:
        """``Store.claim_settings``; then the field ``step`` of ``counters`` is made when missing (a
        namespace made before it was a key every namespace holds), and from now on the scripts check
        the namespace's identity and keys.

        Raises:
            FailedPrecondition: as ``Store.claim_settings``.
        """
        changes = await super().claim_settings(accept_changes)
        await self._do(self._r.hsetnx(self._keys["counters"], "step", 0))
        self._claimed = True
        return changes

    async def check_eviction(self) -> None:
        """Read Redis's ``maxmemory-policy`` (``CONFIG GET``); anything but ``noeviction`` deletes keys
        when memory is full, so it sets :attr:`evicting` (cleared by a later check that finds
        ``noeviction``). A Redis that refuses ``CONFIG GET`` (managed services, an ACL without it) is
        logged once as a warning, and nothing is refused: the operator has to keep it noeviction.

        Raises:
            FailedPrecondition: the policy deletes keys (the message names it and the fix).
            StoreUnavailable: Redis cannot be reached.
        """
        try:
            got = await self._r.config_get("maxmemory-policy")
        except redis_errors.ResponseError as e:  # NOPERM, or CONFIG renamed or disabled (managed Redis)
            if not self._policy_unread:
                log.warning(
                    "Redis at %s refused CONFIG GET maxmemory-policy (%s): the server cannot check that it is "
                    "noeviction, and a Redis that evicts loses a run's keys without an error; make sure it is",
                    self.redacted_url,
                    e,
                )
            self._policy_unread = str(e)
            return
        except (redis_errors.RedisError, OSError) as e:
            await self._after_error(e)
            raise self._error(e) from None
        policy = text(next(iter(got.values()), "")) if got else ""
        was, self.evicting = self.evicting, eviction_error(policy, self.redacted_url) if policy not in ("", "noeviction") else ""
        if was and not self.evicting:
            log.warning("Redis at %s: maxmemory-policy is noeviction again", self.redacted_url)
        if self.evicting:
            raise FailedPrecondition(self.evicting)

    def _refuse_evicting(self) -> None:
        """Raise StoreUnavailable (kind ``evicting``) while Redis's policy deletes keys (:meth:`check_eviction`)."""
        if self.evicting:
            raise StoreUnavailable(f"{self.evicting}; nothing is served until it is, then retry", kind="evicting")

    async def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        self._refuse_evicting()
        keys, args = self._script_call(keys, args)
        want = await self._replicas.wanted() if name in WAITED_SCRIPTS else 0
        if want:

            async def fill(pipe):
                await self._scripts[name](keys=list(keys), args=list(args), client=pipe)
                self._wait(pipe, want)

            res, *tail = await self._pipe(fill, transaction=False)
            await self._check_acks(name, tail, want)
            return res
        try:
            return await self._scripts[name](keys=list(keys), args=list(args))
        except (redis_errors.RedisError, OSError) as e:
            await self._after_error(e)
            raise self._error(e) from None

    async def _after_error(self, e: BaseException) -> None:
        """After the namespace check refused a script, the identity is read again
        (:meth:`check_namespace`: ``namespace_lost`` is set, or a reset is followed). After no
        sentinel named a primary, the sentinels' pooled connections are dropped (at most once a
        second), so the next call discovers the primary over new ones
        (:meth:`RedisConnection.reset_sentinels`)."""
        if namespace_changed(e):
            try:
                await self.check_namespace()
            except PrioreplayError as check_error:  # the call's own error is the one to report
                log.warning("reading the namespace identity failed: %s", check_error)
            return
        if isinstance(e, MasterNotFoundError) and time.monotonic() - self._sentinels_reset_at >= 1.0:
            self._sentinels_reset_at = time.monotonic()
            try:
                await self._connection.reset_sentinels()
            except Exception as reset_error:  # noqa: BLE001 - the call's own error is the one to report
                log.warning("resetting the sentinel connections failed: %s", reset_error)

    def _wait(self, pipe, want: int) -> Any:
        """Queue a small write (the ``health`` key), ``WAIT want timeout`` and ``INFO replication`` (on
        the pipeline's one connection, after its writes): :data:`WAIT_REPLIES` replies. The write
        moves the connection's replication offset to the primary's: a script that wrote nothing (a
        retried report answered ``already reported``) then still waits for the earlier write, made
        on another connection, that it answers for. ``INFO`` tells :meth:`_check_acks` how many
        replicas were connected then (the count of ``all`` may be up to 0.5 s old). Returns the
        pipeline, as its queued commands do."""
        pipe.set(self._keys["health"], float_arg(self.clock()), px=60_000)
        pipe.execute_command("WAIT", want, self._replication.min_replica_acks_timeout_ms)
        return pipe.info("replication")

    async def _check_acks(self, what: str, tail: Sequence[Any], want: int) -> None:
        """Raise StoreUnavailable (kind ``read_only``) when WAIT (in the ``tail`` replies that
        :meth:`_wait` queued) counted fewer than ``want`` replicas, and ``want`` stands once the
        replicas are counted again (``all``: one that went down since is no longer waited for). With
        ``all``, a replica connected since the last count (``INFO`` after the WAIT) raises ``want``
        first: the loss harness lost reports that one replica acknowledged while the count, still
        one, missed the other (just restarted and synced), and the lagging one was promoted."""
        acks, ms = int(tail[-2]), self._replication.min_replica_acks_timeout_ms
        want = self._replicas.saw_connected(int(tail[-1].get("connected_slaves", 0)), want)
        if acks >= want or acks >= (want := await self._replicas.recount()):
            return
        setting = self._replication.min_replica_acks
        asked = "every replica a failover could promote (--min-replica-acks all)" if setting == "all" else "--min-replica-acks"
        raise StoreUnavailable(
            f"Redis at {self.redacted_url}: {what} was acknowledged by {acks} of the {want} replicas "
            f"{asked} asks for within {ms} ms, so it may not survive a failover; check the replicas "
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

    async def stats(self, histogram_buckets: int = 10) -> StoreStats:
        """``Store.stats``, then the identity check (:meth:`check_namespace`, one more round trip): the
        counts of a namespace that is not the claimed one are never answered.

        Raises:
            NamespaceLost: the namespace is lost (as ``Store.stats`` otherwise).
        """
        self._refuse_evicting()
        out = await super().stats(histogram_buckets)
        if self.identity is not None:
            await self.check_namespace()
            if self.namespace_lost is not None:
                raise self.namespace_lost.copy()
        return out

    # -- lifecycle ------------------------------------------------------------------------
    async def healthy(self) -> bool:
        """True when Redis accepts a write: a small ``SET`` with a 60 s expiry (key ``health``).

        PING alone answers while Redis refuses every write (out of memory, a read-only
        replica), so the probe writes; the reason of a failure is logged once per change. Then
        the namespace identity is checked (:meth:`check_namespace`): a lost namespace is
        :attr:`namespace_lost`, not an unhealthy store. Then ``maxmemory-policy``
        (:meth:`check_eviction`): unhealthy while it deletes keys.
        """
        try:
            want = await self._replicas.wanted()
            if want:
                tail = await self._pipe(lambda p: self._wait(p, want), transaction=False)
                await self._check_acks("the health probe", tail, want)
            else:
                await self._do(self._r.set(self._keys["health"], float_arg(self.clock()), px=60_000))
            await self.check_namespace()
            await self.check_eviction()
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
        """Stop the pace wake-up's listener, then close the connection pool (and the connections to the sentinels)."""
        await self.pace.close()
        await self._connection.aclose()
