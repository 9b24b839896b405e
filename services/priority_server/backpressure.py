"""Backpressure: SampleProblems refuses leases while the trajectory queue is over its bound.

A learner slower than the workers lets groups pile up in the trajectory queue; by the time they are
trained on they are stale (and dropped by the learner's ``max_staleness`` rule), so the generation
was wasted. With ``max_queue_depth`` > 0 the server answers SampleProblems with an empty batch,
``backpressure = true`` and ``retry_after_s = backpressure_retry_s`` while the queue holds at least
``max_queue_depth`` groups never delivered to a learner (``GetStats.queue_depth``); workers wait
and ask again. Each refusal is counted (``prioreplay_backpressure_refusals_total``).

The depth is read from the store on every SampleProblems while a bound is set (Redis: XLEN and
XPENDING, two round trips; the memory store: a length), so every server replica sees the same
queue. No bound (the default): no read.
"""

from __future__ import annotations

from .store import Store


class Backpressure:
    """Decides whether SampleProblems refuses a lease because the trajectory queue is too deep.

    Args:
        store: where the queue depth is read (:meth:`Store.queue_depth`).
        max_queue_depth: refuse leases while at least this many groups wait undelivered (>= 1).
        retry_s: the retry hint of a refused lease, seconds (> 0).
    """

    def __init__(self, store: Store, max_queue_depth: int, retry_s: float):
        self.store = store
        self.max_queue_depth = max_queue_depth
        self.retry_s = retry_s

    async def refuse(self) -> bool:
        """True when at least ``max_queue_depth`` groups wait undelivered (raises what the store raises)."""
        return await self.store.queue_depth() >= self.max_queue_depth
