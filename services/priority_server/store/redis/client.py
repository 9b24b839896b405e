"""The Redis store's plumbing: the connection, the scripts, the keys of a run, and the one path every
Redis call goes through (errors mapped by :mod:`.errors`; ``WAIT`` for replica acknowledgements),
plus the health probe and close. :class:`~.store.RedisStore` adds the store's operations."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio.sentinel import MasterNotFoundError

from prioreplay.errors import InvalidArgument, PrioreplayError, StoreUnavailable
from prioreplay.problems import MAX_NAME_BYTES
from prioreplay.redact import redact_url

from ...config import NAMESPACE_RE, ReplicationSettings, StoreConfig
from ..base import Store
from .connection import RedisConnection
from .errors import store_error
from .keys import KEY_NAMES, float_arg, redis_key
from .scripts import SCRIPTS, WAITED_SCRIPTS

log = logging.getLogger(__name__)


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
        clock: Callable[[], float] = time.time,
        replication: ReplicationSettings | None = None,
    ):
        super().__init__(config, clock)
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
        self._scripts = {name: self._r.register_script(src) for name, src in SCRIPTS.items()}
        self._keys = {name: self.key(name) for name in KEY_NAMES}
        self._health_error = ""

    def key(self, name: str) -> str:
        """The Redis key of ``name`` in this run: ``prioreplay:{<namespace>}:<name>``."""
        return redis_key(self.namespace, name)

    # -- plumbing -------------------------------------------------------------------------
    def _error(self, e: Exception) -> PrioreplayError:
        """Our error for a Redis error (the one place every Redis call goes through; :func:`.errors.store_error`)."""
        return store_error(e, self.redacted_url)

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

    # -- lifecycle ------------------------------------------------------------------------
    async def healthy(self) -> bool:
        """True when Redis accepts a write: a small ``SET`` with a 60 s expiry (key ``health``).

        PING alone answers while Redis refuses every write (out of memory, a read-only
        replica), so the probe writes; the reason of a failure is logged once per change.
        """
        try:
            if self._replication.min_replica_acks:
                _, acks = await self._pipe(
                    lambda p: (p.set(self._keys["health"], float_arg(self.clock()), px=60_000), self._wait(p)), transaction=False
                )
                self._check_acks("the health probe", acks)
            else:
                await self._do(self._r.set(self._keys["health"], float_arg(self.clock()), px=60_000))
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
