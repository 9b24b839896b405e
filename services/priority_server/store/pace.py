"""The store's side of the pace bound (``--pace-batches K``): the learner's batch, the room rule,
and the wake-up of SampleProblems calls that wait for room.

The rule (store/base.py, "sample" step 1b) runs inside ``sample``, atomically with the lease, in
both stores: ahead = groups queued and never delivered + problems in live leases, b = the learner's
batch in groups, room = K·b − ahead; a batch is cut to the room, and with none nothing is leased.
What waits for room, and for how long, is the server's (:mod:`..pacing`); this module gives it the
store's two halves:

* the learner's batch ``b``: declared by the learner on every PullTrajectories
  (``learner_batch_groups``) and kept where every replica reads it (memory: this process; Redis:
  field ``learner_batch`` of the ``policy`` hash, read by ``sample.lua``);
* a wake-up (:meth:`LocalPace.mark`, :meth:`~LocalPace.wait`, :meth:`~LocalPace.signal`): a call
  that found no room takes a mark, samples again, and waits until a signal newer than its mark
  (a pull, a report or a release that made room) or its timeout. Nothing polls. In one process
  it is an ``asyncio.Event``; the Redis store's (:class:`.redis.pace.RedisPace`) is a stream every
  replica's waiting calls block on (``XREAD BLOCK``), so a pull answered by one replica wakes the
  leases waiting on all of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..config import StoreConfig
from .records import Lease


def pace_room(config: StoreConfig, batch_size: int, ahead: Callable[[], int], learner_batch: int) -> int:
    """The batch the pace bound lets one ``sample`` lease (store/base.py, "sample" 1b).

    Args:
        config: ``pace_batches`` K (0: no bound) and ``pace_batch_groups`` (the learner's batch
            until one is declared).
        batch_size: B, the batch asked for (>= 1).
        ahead: returns the groups ahead of the learner: queued and never delivered, plus problems
            in live leases (called only with a bound).
        learner_batch: the batch the learner declared, groups (0: none yet).

    Returns:
        ``batch_size`` without a bound; else min(B, K·b − ahead) with b = ``learner_batch`` or
        ``pace_batch_groups`` or B (< 1: no room).
    """
    if config.pace_batches <= 0:
        return batch_size
    b = learner_batch or config.pace_batch_groups or batch_size
    return min(batch_size, config.pace_batches * b - ahead())


def pace_refusal(version: int, weights_uri: str, step: int, until_expiry_s: float) -> Lease:
    """The answer of a ``sample`` the pace bound left no room: no lease, ``paced``, and as
    ``retry_after_s`` the seconds until the earliest live lease deadline (``math.inf`` with none),
    when an expiry could make room (store/base.py, "sample" 1b)."""
    return Lease("", 0.0, [], version, weights_uri, max(0.0, until_expiry_s), step, paced=True)


def pace_limit(config: StoreConfig, learner_batch: int) -> int:
    """K·b, the groups the bound lets be ahead of the learner (0: no bound or b not known yet)."""
    return config.pace_batches * (learner_batch or config.pace_batch_groups)


class LocalPace:
    """The learner's batch and the wake-up, in this process (the memory store's; module docstring).

    Attributes:
        learner_batch: the learner's batch in groups (0 until a learner declares one); not in the
            memory store's snapshot: after a restart the bound uses ``pace_batch_groups`` (or each
            call's batch) until the learner's next pull.
    """

    def __init__(self) -> None:
        self.learner_batch = 0
        self._event = asyncio.Event()

    async def read_learner_batch(self) -> int:
        """The learner's batch in groups (0: not declared yet)."""
        return self.learner_batch

    async def note_learner_batch(self, groups: int, floor: int = 0) -> None:
        """Record the learner's batch (>= 1) and, when the bound grew, wake the waiting calls (more
        room). ``floor``: the batch the bound used before any was declared (``pace_batch_groups``);
        a first declaration no larger than it makes no room, so it wakes nobody (a wake-up that
        finds no room costs every waiting call a sample)."""
        grew = groups > (self.learner_batch or floor)
        self.learner_batch = groups
        if grew:
            await self.signal()

    async def mark(self) -> Any:
        """What :meth:`wait` waits on: take it before the ``sample`` that may find no room."""
        return self._event

    async def wait(self, mark: Any, timeout_s: float) -> None:
        """Return when a signal came after ``mark`` was taken, or after ``timeout_s`` seconds."""
        try:
            await asyncio.wait_for(mark.wait(), timeout_s)
        except TimeoutError:
            pass

    async def signal(self) -> None:
        """Room may have been made: wake every call holding the current mark (later marks get a
        fresh event). Set even while none waits yet: a call between its mark and its wait sees it."""
        self._event.set()
        self._event = asyncio.Event()

    async def close(self) -> None:
        """Nothing to release in one process."""
