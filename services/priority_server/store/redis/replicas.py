"""How many Redis replicas a change waits for (``WAIT``), and following the primary Sentinel names.

``--min-replica-acks`` is a number N, or ``all`` (the default): every replica a failover could
promote. A change acknowledged by all of them survives any single failover, whichever replica the
sentinels pick. ``all`` is counted, not configured, because the set changes at run time (a replica
restarted, the old primary demoted into a replica after a failover):

* behind Sentinel (``redis+sentinel://``): the replicas the sentinels list for the service
  (``SENTINEL REPLICAS <name>``) that they could promote: not subjectively or objectively down,
  ``replica-priority`` not 0; the largest count any sentinel gives. A replica the sentinels list
  as ``disconnected`` is counted: right after a failover every sentinel lists the new primary's
  replicas so until it has connected to them, and the harness lost acknowledged reports when that
  moment counted as no replica at all. A listed replica that still reports the role ``master``
  is not counted: it is the old primary after a failover, which the sentinels demote only seconds
  later (a role they see for 8 s); it follows no one, so no WAIT can count it, and waiting for it
  would refuse every change until then (a planned failover's outage was ~11 s, now ~2 s). A second
  failover within that delay that promoted it would lose what the new primary acknowledged
  meanwhile: a known limit (docs/GUARANTEES.md);
* while any sentinel reports the primary down or a failover in progress, the count does not go
  down: in the middle of a switch the promoted replica already reports ``master`` while the old
  primary still takes writes and its other replica still acknowledges them, and a change
  acknowledged then by that replica alone would be lost when it is moved to the new primary;
* and never fewer than the replicas connected to the primary now (``INFO replication``,
  ``connected_slaves``, read at each count and after every WAIT: :meth:`ReplicaTarget.saw_connected`):
  a replica that has just reconnected, or that the sentinels have not discovered yet (they read
  ``INFO`` every 10 s), can already be promoted.

Counting only the connected replicas is not enough: the loss harness (``benchmarks/failover_loss.py``)
lost acknowledged reports when a replica restarted mid-run reconnected (listed by the sentinels,
promotable, not yet counted by the primary) and a failover then picked it.

The count is cached for :data:`REFRESH_S` seconds; a WAIT that falls short refreshes it (at most
every :data:`SHORT_REFRESH_S`) before the change is refused, so a replica that has just gone down
stops being waited for as soon as the sentinels mark it down. The same refresh asks the sentinels
for the primary's address and, when it changed, closes the pooled connections to the old one
(redis-py's ``SentinelConnectionPool.get_master_address``): otherwise they go on writing to the old
primary until it is demoted (seconds after a planned ``SENTINEL FAILOVER``), and every such write is
refused for want of replicas.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from redis import exceptions as redis_errors

from ...config import ReplicationSettings
from .connection import RedisConnection

log = logging.getLogger(__name__)
#: Seconds a counted ``all`` (and the primary's address) is used before it is counted again.
REFRESH_S = 0.5
#: Seconds between refreshes forced by a WAIT that fell short.
SHORT_REFRESH_S = 0.1
#: Seconds the primary has to answer ``INFO replication`` (a paused primary is not waited for).
INFO_TIMEOUT_S = 1.0
#: Sentinel flags of a replica a failover does not promote (redis-py's names of ``s_down``, ``o_down``).
NOT_PROMOTABLE_FLAGS = ("is_sdown", "is_odown")


def promotable(replica: dict[str, Any]) -> bool:
    """Whether a replica the sentinels list (one entry of redis-py's ``sentinel_slaves``) counts: not
    down, ``slave-priority`` not 0 (priority 0: never promoted), not reporting the role ``master``
    (an old primary not demoted yet: see the module docstring)."""
    return (
        not any(replica.get(flag) for flag in NOT_PROMOTABLE_FLAGS)
        and int(replica.get("slave-priority", 1)) != 0
        and replica.get("role-reported", "slave") != "master"
    )


class ReplicaTarget:
    """The number of replicas each ``WAIT`` asks for (see the module docstring).

    Args:
        connection: the store's connection (its ``sentinel`` and ``service_name``, None for a plain URL).
        replication: the settings; ``min_replica_acks`` an int N (always N) or ``"all"`` (counted).
    """

    def __init__(self, connection: RedisConnection, replication: ReplicationSettings):
        self._connection = connection
        self.setting = replication.min_replica_acks
        self._count = 0
        self._listed = 0  # the sentinels' last count
        self._counted_at = float("-inf")  # monotonic seconds
        self._lock = asyncio.Lock()

    @property
    def waits(self) -> bool:
        """Whether changes wait for replicas at all (``all``, or N > 0)."""
        return self.setting != 0

    async def wanted(self) -> int:
        """Replicas the next WAIT asks for: N, or ``all`` counted (cached :data:`REFRESH_S`); 0: no WAIT.

        Behind Sentinel the primary's address is checked at the same pace whatever the setting.
        """
        if self.setting == "all" or self._connection.sentinel is not None:
            await self.refresh(REFRESH_S)
        return self._count if self.setting == "all" else int(self.setting)

    def saw_connected(self, connected: int, want: int) -> int:
        """``want`` after ``connected`` replicas were seen connected to the primary (``INFO`` after a WAIT):
        with ``all`` never fewer (and the count is raised until the next refresh); N stays N."""
        if self.setting != "all":
            return want
        self._count = max(self._count, connected)
        return max(want, connected)

    async def recount(self) -> int:
        """:meth:`wanted` after a WAIT fell short: counted again unless counted within :data:`SHORT_REFRESH_S`."""
        await self.refresh(SHORT_REFRESH_S)
        return self._count if self.setting == "all" else int(self.setting)

    async def refresh(self, max_age_s: float) -> None:
        """Count the replicas (and follow the primary's address) when the last count is older than ``max_age_s``."""
        if time.monotonic() - self._counted_at < max_age_s:
            return
        async with self._lock:  # one refresh for the callers that found it stale together
            if time.monotonic() - self._counted_at < max_age_s:
                return
            await self._follow_primary()
            if self.setting == "all":
                listed, switching = await self._sentinel_count()
                if listed is None:  # no sentinel answered: the last count stands
                    listed = self._listed
                elif switching:  # a failover under way: no replica stops counting until it ends
                    listed = max(listed, self._listed)
                self._listed = listed
                self._count = max(self._listed, await self._connected_count())
            self._counted_at = time.monotonic()

    async def _follow_primary(self) -> None:
        """Ask the sentinels for the primary; a new address closes the idle connections to the old
        one (redis-py does that) and marks those in use to be closed when they come back to the pool
        (redis-py's asyncio pool would hand them out again: they would go on writing to the old
        primary). No primary known: nothing to do (the next call fails over the usual path)."""
        if self._connection.sentinel is None:
            return
        pool: Any = self._connection.client.connection_pool
        before = pool.master_address
        try:
            now = await pool.get_master_address()
        except (redis_errors.RedisError, OSError) as e:
            log.debug("no primary from the sentinels now: %s", e)
            return
        if before is not None and now != before:
            for conn in list(getattr(pool, "_in_use_connections", ())):
                conn.mark_for_reconnect()
            log.info("the sentinels name a new primary %s:%s (was %s:%s): following it", *now, *before)

    async def _sentinel_count(self) -> tuple[int | None, bool]:
        """(the most replicas any sentinel lists as :func:`promotable`, whether any sentinel reports
        the primary down or a failover in progress); (0, False) without sentinels, (None, False)
        when none answered."""
        sentinel, name = self._connection.sentinel, self._connection.service_name
        if sentinel is None or name is None:
            return 0, False

        async def ask(client) -> tuple[int, bool] | None:
            try:
                state = await client.sentinel_master(name)
                replicas = await client.sentinel_slaves(name)
            except (redis_errors.RedisError, OSError):
                return None
            switching = bool(state.get("is_sdown") or state.get("is_odown") or "failover_in_progress" in state["flags"])
            return sum(promotable(r) for r in replicas), switching

        answers = [a for a in await asyncio.gather(*(ask(c) for c in sentinel.sentinels)) if a is not None]
        if not answers:
            return None, False
        return max(n for n, _ in answers), any(switching for _, switching in answers)

    async def _connected_count(self) -> int:
        """The replicas connected to the primary now (``INFO replication``), 0 when it cannot be read."""
        try:
            info = await asyncio.wait_for(self._connection.client.info("replication"), INFO_TIMEOUT_S)
        except (redis_errors.RedisError, OSError, TimeoutError):
            return 0
        return int(info.get("connected_slaves", 0))
