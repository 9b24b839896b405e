"""The trajectory queue's part of the store interface: pull, release, acknowledge (a Redis stream
with one consumer group, or its in-process twin).

:class:`~.base.Store` inherits it; its exact semantics are in :mod:`.base`'s docstring, "Trajectory
queue". The public methods validate and delegate to the ``_`` hooks each store implements
(:class:`~.memory_queue.MemoryTrajectoryQueue`; the Redis store's ``pull.lua`` / ``ack.lua``).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Sequence

from prioreplay.errors import InvalidArgument
from prioreplay.problems import check_name

from ..config import StoreConfig
from .contract import QueueWatch
from .records import Delivery


class TrajectoryQueue(abc.ABC):
    """Deliver queued trajectory groups to learners, at least once (see :mod:`.base`, "Trajectory queue")."""

    config: StoreConfig

    async def pull(
        self, consumer: str, max_groups: int, include_own_pending: bool = False, wait_s: float = 0.0
    ) -> list[Delivery]:
        """Deliver up to ``max_groups`` groups to ``consumer``; with nothing to deliver, wait up to
        ``wait_s`` seconds (wall clock) for a group, woken by the report that queues it (see the
        module docstring, "Trajectory queue").

        Raises:
            InvalidArgument: max_groups outside [1, max_batch_size] or consumer over MAX_NAME_BYTES (128) bytes.
        """
        if not (isinstance(max_groups, int) and 1 <= max_groups <= self.config.max_batch_size):
            raise InvalidArgument(
                f"max_groups ({max_groups}) must be in [1, {self.config.max_batch_size}] "
                "(the server's --max-batch-size sets the upper bound)"
            )
        consumer = consumer or "learner"
        check_name(consumer, "consumer name")
        if wait_s <= 0:
            return await self._pull(consumer, max_groups, include_own_pending)
        deadline = time.monotonic() + wait_s
        while True:
            out, watch = await self._pull_watched(consumer, max_groups, include_own_pending)
            left = deadline - time.monotonic()
            if out or left <= 0:
                return out
            include_own_pending = False  # handed back by the first pull
            await self._wait_queued(watch, min(left, watch.idle_in_s))

    async def release(self, consumer: str, deliveries: Sequence[Delivery]) -> int:
        """Hand back deliveries that were never sent (see the module docstring). Returns how many."""
        if not deliveries:
            return 0
        return await self._release(consumer or "learner", list(deliveries))

    async def ack(self, group_ids: Sequence[str]) -> tuple[int, int]:
        """Acknowledge delivered groups. Returns (acked, unknown)."""
        ids = list(dict.fromkeys(group_ids))
        if not ids:
            return 0, 0
        acked = await self._ack(ids)
        return acked, len(group_ids) - acked

    @abc.abstractmethod
    async def queue_depth(self) -> int:
        """Groups queued and never delivered (cheap: no histogram, unlike :meth:`stats`)."""

    # -- implementation hooks -------------------------------------------------------------
    @abc.abstractmethod
    async def _pull(self, consumer: str, max_groups: int, include_own_pending: bool) -> list[Delivery]: ...

    @abc.abstractmethod
    async def _pull_watched(self, consumer: str, max_groups: int, include_own_pending: bool) -> tuple[list[Delivery], QueueWatch]:
        """:meth:`_pull`, and what :meth:`_wait_queued` waits on after it when it delivered nothing."""

    @abc.abstractmethod
    async def _wait_queued(self, watch: QueueWatch, timeout_s: float) -> None:
        """Return when a group was queued after ``watch`` was taken, or after ``timeout_s`` seconds
        (a spurious early return is harmless: the caller pulls again)."""

    @abc.abstractmethod
    async def _ack(self, group_ids: list[str]) -> int: ...

    @abc.abstractmethod
    async def _release(self, consumer: str, deliveries: list[Delivery]) -> int: ...
