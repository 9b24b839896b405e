"""The in-process trajectory queue: Redis-stream semantics with one consumer group, in memory.

Groups never delivered wait in report order (``MemoryState.new``); delivered, unacknowledged ones
are pending by id with their consumer, last delivery time and delivery count (``MemoryState.pending``,
indexed by consumer in ``_by_consumer``). A waiting pull sleeps on an :class:`asyncio.Event` that
queueing a group sets (never polled). :class:`~.memory_store.MemoryStore` mixes it in; the semantics
are :mod:`.base`'s docstring, "Trajectory queue".
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from sortedcontainers import SortedList

from ..config import StoreConfig
from . import snapshot
from .contract import QueueWatch
from .queue import TrajectoryQueue
from .records import Delivery
from .snapshot import MemoryState, QueuedGroup


class MemoryTrajectoryQueue(TrajectoryQueue):
    """The queue's hooks over the store's records (``_s``); the store sets the attributes below."""

    config: StoreConfig
    clock: Callable[[], float]
    _s: MemoryState
    #: pending group keys by consumer
    _by_consumer: dict[str, SortedList]
    #: set (and replaced) when a group is queued while a pull waits
    _queued: asyncio.Event
    #: pulls waiting on ``_queued``
    _waiting: int

    def _enqueue(self, payload: bytes, now: float) -> None:
        """Append a group with a stream-style id "ms-seq" that always increases."""
        ms = int(math.floor(now * 1000.0))
        last_ms, last_seq = self._s.last_key
        key = (ms, 0) if ms > last_ms else (last_ms, last_seq + 1)
        self._s.last_key = key
        self._s.new[key] = QueuedGroup(key=key, payload=bytes(payload))
        self._wake()

    def _wake(self) -> None:
        """Wake every pull waiting on the current event; later waits take a fresh one (nothing to do,
        and no new event made per queued group, while no pull waits)."""
        if self._waiting:
            self._queued.set()
            self._queued = asyncio.Event()

    def _deliver(self, g: QueuedGroup, consumer: str, now: float) -> Delivery:
        if g.consumer != consumer:
            if g.consumer:
                self._by_consumer[g.consumer].remove(g.key)
                if not self._by_consumer[g.consumer]:
                    del self._by_consumer[g.consumer]
            self._by_consumer.setdefault(consumer, SortedList()).add(g.key)
            g.consumer = consumer
        g.delivery_count += 1
        g.delivered_at = now
        return Delivery(snapshot.group_id(g.key), g.payload, g.delivery_count)

    async def queue_depth(self) -> int:
        return len(self._s.new)

    async def _pull(self, consumer: str, max_groups: int, include_own_pending: bool) -> list[Delivery]:
        now = self.clock()
        pending = self._s.pending
        out: list[Delivery] = []
        if include_own_pending and consumer in self._by_consumer:
            for key in list(self._by_consumer[consumer][:max_groups]):
                out.append(self._deliver(pending[key], consumer, now))
        if len(out) < max_groups:
            timeout = self.config.redelivery_timeout_s
            idle = [g for g in pending.values() if now - g.delivered_at >= timeout]
            for g in idle[: max_groups - len(out)]:
                out.append(self._deliver(g, consumer, now))
        while len(out) < max_groups and self._s.new:
            key, g = self._s.new.popitem(last=False)
            pending[key] = g
            out.append(self._deliver(g, consumer, now))
        return out

    async def _pull_watched(self, consumer: str, max_groups: int, include_own_pending: bool) -> tuple[list[Delivery], QueueWatch]:
        mark = self._queued  # taken before the pull (no await in between): a group queued after it sets it
        out = await self._pull(consumer, max_groups, include_own_pending)
        idle_in = math.inf
        if not out and self._s.pending:
            first = min(g.delivered_at for g in self._s.pending.values())
            idle_in = max(0.001, first + self.config.redelivery_timeout_s - self.clock())
        return out, QueueWatch(mark, idle_in)

    async def _wait_queued(self, watch: QueueWatch, timeout_s: float) -> None:
        self._waiting += 1  # no await since the mark was taken (Store.pull): no group queued in between unseen
        try:
            await asyncio.wait_for(watch.mark.wait(), timeout_s)
        except TimeoutError:
            pass
        finally:
            self._waiting -= 1

    async def _release(self, consumer: str, deliveries: list[Delivery]) -> int:
        idle_since = self.clock() - self.config.redelivery_timeout_s
        released = 0
        for d in deliveries:
            key = snapshot.parse_group_id(d.group_id)
            g = self._s.pending.get(key) if key is not None else None
            if g is None or g.consumer != consumer:
                continue
            g.delivery_count = max(0, d.delivery_count - 1)
            g.delivered_at = idle_since  # idle at once: the next pull takes it before new groups
            released += 1
        if released:
            self._wake()
        return released

    async def _ack(self, group_ids: list[str]) -> int:
        acked = 0
        for gid in group_ids:
            key = snapshot.parse_group_id(gid)
            g = self._s.pending.pop(key, None) if key is not None else None
            if g is None:
                continue
            mine = self._by_consumer[g.consumer]
            mine.remove(key)
            if not mine:
                del self._by_consumer[g.consumer]
            acked += 1
        self._s.counters["groups_acked"] += acked
        return acked
