"""The Redis store's side of the pace bound (:mod:`..pace`): the learner's batch in the ``policy``
hash, and the wake-up as a stream every server replica reads.

* **learner batch**: ``HSET policy learner_batch N`` on every pull that declares it (one round
  trip per pull, only with a bound); ``sample.lua`` reads it atomically with the lease.
* **wake-up**: a call that found no room takes a mark (the last id of the ``pace`` stream), samples
  again and waits for an entry after its mark. A pull that delivered groups, or a report that made
  room, adds an entry (``XADD pace MAXLEN ~ 64``) through whichever replica answered it. One
  listener per process blocks in ``XREAD BLOCK`` from the oldest mark waiting and wakes every call
  of the process at once, so a fleet of waiting workers holds one Redis connection per replica, not
  one each. A mark older than the listener's start has an entry after it already: that call returns
  at once (it samples again; spurious wake-ups are harmless, lost ones impossible).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ...config import StoreConfig
from ..pace import LocalPace

if TYPE_CHECKING:  # pragma: no cover
    from .store import RedisStore

log = logging.getLogger(__name__)

#: Entries the ``pace`` stream keeps, about (only the newest id matters).
PACE_STREAM_LEN = 64
#: Longest single ``XREAD BLOCK`` of the listener, seconds (a waiting call still ends at its own timeout).
LISTEN_S = 30.0


def pace_args(config: StoreConfig, retests: bool, group: str) -> dict[str, Any]:
    """The pace bound's entries of ``sample.lua``'s ``run`` argument (its header, step 1b)."""
    return {
        "pace_batches": config.pace_batches,
        "pace_batch_groups": config.pace_batch_groups,
        "group": group,
        "retest_fraction": config.retest_fraction if retests else 0.0,
    }


def _stream_id(s: str) -> tuple[int, int]:
    ms, _, seq = s.partition("-")
    return int(ms), int(seq or 0)


class RedisPace(LocalPace):
    """:class:`..pace.LocalPace`'s interface over Redis (module docstring); ``learner_batch`` is the
    value this process last wrote (the store's is read by ``sample.lua``).

    Raises:
        StoreUnavailable, Internal: from every method but :meth:`wait` (as every store call).
    """

    def __init__(self, store: RedisStore):
        super().__init__()
        self._store = store
        self._key = store.key("pace")
        self._listener: asyncio.Task | None = None
        self._from = (0, 0)  # the id the running listener reads after
        self._woken = asyncio.Event()

    async def read_learner_batch(self) -> int:
        value = await self._store._do(self._store._r.hget(self._store.key("policy"), "learner_batch"))
        return int(value or 0)

    async def note_learner_batch(self, groups: int, floor: int = 0) -> None:
        """As :meth:`LocalPace.note_learner_batch`, against the batch any replica last wrote (read
        and replaced in one transaction), not this process's."""
        key = self._store.key("policy")

        async def swap() -> int:
            async with self._store._r.pipeline(transaction=True) as p:
                p.hget(key, "learner_batch")
                p.hset(key, "learner_batch", groups)
                before, _ = await p.execute()
            return int(before or 0)

        before = await self._store._do(swap())
        self.learner_batch = groups
        if groups > (before or floor):
            await self.signal()

    async def mark(self) -> Any:
        last = await self._store._do(self._store._r.xrevrange(self._key, "+", "-", count=1))
        return last[0][0].decode() if last else "0-0"

    async def wait(self, mark: Any, timeout_s: float) -> None:
        """Return at the first entry after ``mark`` (any replica's), or after ``timeout_s`` seconds.
        A Redis error ends the wait (the caller's next sample meets it)."""
        after = _stream_id(mark)
        running = self._listener is not None and not self._listener.done()
        if running and after < self._from:
            return  # the listener started after an entry newer than this mark: there was a wake-up
        if not running:
            self._from, self._woken = after, asyncio.Event()
            self._listener = asyncio.create_task(self._listen(mark, self._woken))
        try:
            await asyncio.wait_for(self._woken.wait(), timeout_s)
        except TimeoutError:
            pass

    async def _listen(self, mark: str, woken: asyncio.Event) -> None:
        # on the blocking client: the command client's reply time-out (SOCKET_TIMEOUT_S) is shorter
        # than the block, and a timed-out read would wake every held call to sample again
        connection = self._store._connection
        block_ms = int(min(LISTEN_S, connection.max_block_s) * 1000)
        try:
            await self._store._do(connection.blocking.xread({self._key: mark}, count=1, block=block_ms))
        except Exception as e:  # noqa: BLE001 -- the waiting calls sample again and meet it there
            log.debug("pace wake-up: XREAD failed (%s); waking the waiting leases", e)
        finally:
            woken.set()

    async def signal(self) -> None:
        await self._store._do(self._store._r.xadd(self._key, {"w": "1"}, maxlen=PACE_STREAM_LEN, approximate=True))

    async def close(self) -> None:
        """Stop the listener (its XREAD holds a pooled connection)."""
        if self._listener is not None and not self._listener.done():
            self._listener.cancel()
            try:
                await self._listener
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 -- closing anyway
                pass
