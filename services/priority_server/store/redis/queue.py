"""The Redis store's trajectory queue: the learner's side of the stream (pull, wait, release, ack).

The queue is one Redis stream (key ``stream``, field ``p`` = a group's payload) with one consumer
group (:data:`CONSUMER_GROUP`); ``report.lua`` appends to it, ``pull.lua`` delivers from it (new
entries, then redeliveries of groups idle past ``redelivery_timeout_s``), ``ack.lua`` deletes what
the learner trained. Semantics: :mod:`prioreplay.priority_server.store.base`, "The learner queue".
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from typing import Any

from ..contract import QueueWatch
from ..records import Delivery
from .client import RedisClient
from .keys import text
from .scripts import SCRIPT_ARGS

PULL, ACK = SCRIPT_ARGS["pull"], SCRIPT_ARGS["ack"]
#: Consumer group of the trajectory stream.
CONSUMER_GROUP = "learners"
#: Waiting pulls that may hold a pooled connection in ``XREAD BLOCK`` at once, per store (process);
#: more wait for a free one (each pull still ends by its ``wait_s``).
MAX_BLOCKED_PULLS = 32
_STREAM_ID_RE = re.compile(r"^\d{1,20}-\d{1,20}$")


class RedisQueue(RedisClient):
    """The trajectory queue's operations of :class:`.store.RedisStore` (a base class of it).

    Args:
        *args, **kwargs: those of :class:`.client.RedisClient`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._blocked_pulls = asyncio.Semaphore(MAX_BLOCKED_PULLS)

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

    async def _undelivered(self) -> list[bytes]:
        k = self._keys["stream"]
        if not await self._do(self._r.exists(k)):
            return []
        groups = await self._do(self._r.xinfo_groups(k))
        last = next(text(g["last-delivered-id"]) for g in groups if text(g["name"]) == CONSUMER_GROUP)
        entries = await self._do(self._r.xrange(k, min="(" + last, max="+"))
        return [bytes(fields[b"p"]) for _, fields in entries]
