"""Pacing: how much SampleProblems may lease now, so that generation follows the learner.

Two bounds, one gate (:class:`Pacing`), both read from the store so that every server replica
applies the same:

* **The pace bound** (``--pace-batches K``, off by default): lease only while the groups queued
  for the learner and not yet delivered, plus the problems leased and not yet reported, plus the
  new batch stay within K learner batches (AReaL's ``max_head_offpolicyness`` and prime-rl's
  ``async_level`` bound the same lead, in policy versions). The rule runs in the store, atomically
  with the lease (store/base.py, "sample" step 1b; :mod:`.store.pace`): a batch is cut to the room
  left; with none, nothing is leased and this module holds the call. It waits (a long poll) until
  a pull delivers groups, a report or release frees leased problems without queueing them, the
  learner declares a larger batch, or the earliest lease expires, then samples again; after
  ``--pace-wait-s`` (always below the call's own deadline) it answers an empty batch with
  ``paced = true`` and ``retry_after_s = 0``: ask again at once, nothing to log. The learner's
  batch comes from its pulls (``PullTrajectoriesRequest.learner_batch_groups``), kept in the
  store; before the first pull the bound counts ``--pace-batch-groups``, or each call's own
  ``batch_size`` when that is 0 too.
* **The queue bound** (``--max-queue-depth D``, "backpressure", on by default at 1024 groups): a
  memory bound, not a pace: SampleProblems is refused (empty batch, ``backpressure = true``,
  ``retry_after_s = --backpressure-retry-s``) while at least D groups wait undelivered
  (``GetStats.queue_depth``; Redis: XLEN and XPENDING, two round trips). Each refusal is counted
  (``prioreplay_backpressure_refusals_total``). With a pace bound the queue never holds more than
  K learner batches, so D matters only when K·b is larger.

Metrics: ``prioreplay_pace_wait_seconds`` (a histogram of each held call's wait),
``prioreplay_pace_bound_groups`` (K·b; 0 off or b unknown; set on a pull and by the runtime's
refresh from the store) and, from the store's counts, ``prioreplay_pace_groups_ahead``
(undelivered + leased).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from prioreplay.errors import InvalidArgument

from .store import Store
from .store.pace import pace_limit
from .store.records import Lease, ReportResult

if TYPE_CHECKING:  # pragma: no cover
    from .metrics import ServerMetrics

#: Seconds past the earliest lease deadline a held call samples again (the expiry is then due).
EXPIRY_MARGIN_S = 0.05
#: The least share of the call's remaining deadline kept free of waiting, and the least seconds.
DEADLINE_SHARE, DEADLINE_MARGIN_S = 0.2, 1.0


class Pacing:
    """The lease gate of one server process (module docstring).

    Args:
        store: where the bounds are read and the leases made.
        max_queue_depth: the queue bound D (0: none).
        backpressure_retry_s: the retry hint of a lease the queue bound refuses, seconds (> 0).
        wait_s: the longest a call is held by the pace bound, seconds (> 0).
        metrics: where waits and the bound are recorded (optional).
    """

    def __init__(
        self,
        store: Store,
        max_queue_depth: int = 0,
        backpressure_retry_s: float = 2.0,
        wait_s: float = 10.0,
        metrics: ServerMetrics | None = None,
    ):
        self.store = store
        self.max_queue_depth = max_queue_depth
        self.retry_s = backpressure_retry_s
        self.wait_s = wait_s
        self.metrics = metrics
        self.paced = store.config.pace_batches > 0
        self._export_limit(0)

    async def refuse(self) -> bool:
        """True when the queue bound refuses a lease: at least ``max_queue_depth`` groups wait
        undelivered (no read without a bound; raises what the store raises)."""
        return self.max_queue_depth > 0 and await self.store.queue_depth() >= self.max_queue_depth

    def budget(self, time_left: float | None) -> float:
        """Seconds a call may be held: ``wait_s``, less when the call's deadline (``time_left``
        seconds; None: none) comes first, keeping max(1 s, 20%) of it to answer."""
        if time_left is None:
            return self.wait_s
        return max(0.0, min(self.wait_s, time_left - max(DEADLINE_MARGIN_S, DEADLINE_SHARE * time_left)))

    async def sample(
        self, batch_size: int, lease_timeout_s: float | None, request_id: str, worker_id: str, time_left: float | None = None
    ) -> tuple[Lease, float]:
        """Lease as :meth:`Store.sample` does; while the pace bound leaves no room, wait for room
        (woken, never polled) up to :meth:`budget` seconds.

        Returns:
            The lease (``paced`` when the bound still left no room at the end) and the seconds
            the call was held (0.0 when it was not).

        Raises:
            What :meth:`Store.sample` raises.
        """
        lease = await self.store.sample(batch_size, lease_timeout_s, request_id=request_id, worker_id=worker_id)
        if not lease.paced:
            return lease, 0.0
        start = time.monotonic()
        budget = self.budget(time_left)
        while True:
            mark = await self.store.pace.mark()  # before the sample: a wake-up after it ends the wait at once
            lease = await self.store.sample(batch_size, lease_timeout_s, request_id=request_id, worker_id=worker_id)
            waited = time.monotonic() - start
            if not lease.paced or waited >= budget:
                break
            until_expiry = lease.retry_after_s + EXPIRY_MARGIN_S if math.isfinite(lease.retry_after_s) else math.inf
            await self.store.pace.wait(mark, min(budget - waited, until_expiry))
        if self.metrics is not None:
            self.metrics.pace_wait_seconds.observe(waited)
        return lease, waited

    def retry_after(self, waited: float) -> float:
        """The retry hint of a ``paced`` answer: 0 (ask again at once) once the call was held for a
        second (or the whole ``wait_s``); 1 s when its deadline left no time to hold it."""
        return 0.0 if waited >= min(1.0, self.wait_s) else 1.0

    async def pulling(self, learner_batch_groups: int) -> None:
        """A learner pulls: record the batch it declares (0: not declared), before its pull waits.

        Raises:
            InvalidArgument: ``learner_batch_groups`` above the server's max_batch_size (naming both).
        """
        limit = self.store.config.max_batch_size
        if learner_batch_groups > limit:
            raise InvalidArgument(
                f"learner_batch_groups ({learner_batch_groups}) must be <= {limit} (the server's --max-batch-size)"
            )
        if self.paced and learner_batch_groups:
            await self.store.pace.note_learner_batch(learner_batch_groups, floor=self.store.config.pace_batch_groups)
            self._export_limit(learner_batch_groups)

    async def delivered(self, n: int) -> None:
        """A pull delivered ``n`` groups: they no longer count as ahead, so wake the held calls."""
        if self.paced and n:
            await self.store.pace.signal()

    async def reported(self, result: ReportResult, outcomes: int, more_parts: bool) -> None:
        """A report was applied: wake the held calls when it freed leased problems without queueing
        them (a filtered or rewards-only group, a quarantined problem, a lease handed back empty).
        A lease whose last part leaves problems unreported frees them too, unseen here: the held
        calls see that room at their next wake-up."""
        if not (self.paced and result.accepted):
            return
        fresh = outcomes - result.skipped
        if result.groups_queued < fresh or result.quarantined or (not more_parts and not outcomes):
            await self.store.pace.signal()

    def _export_limit(self, learner_batch: int) -> None:
        """Set ``prioreplay_pace_bound_groups`` to K·b (the runtime's refresh also sets it from the
        store, so every replica shows the batch any of them was told)."""
        if self.metrics is not None:
            self.metrics.pace_bound.set(pace_limit(self.store.config, learner_batch))


__all__ = ["Pacing"]
