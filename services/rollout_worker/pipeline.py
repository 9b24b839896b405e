"""The pipelined worker loop: the next lease is requested, and the last batch verified and
reported, while the backend generates (``--pipeline``, the default).

One worker's timeline (``G``: the backend's ``generate``, always on the thread that calls
:meth:`PipelinedLoop.run`; ``L``: ``SampleProblems``; ``F``: verify, convert and ``ReportOutcomes``;
``L`` and ``F`` each on a daemon thread of their own)::

    generate:  G(k) ────────────  G(k+1) ────────────  G(k+2) ...
    lease:     L(k+1)             L(k+2)
    finish:                       F(k) ──────          F(k+1) ──────

At most one lease is held ahead and one batch is being verified and reported, so memory holds at
most three batches (one generating, one reporting, one leased). The rules of the sequential loop
hold unchanged (docs/GUARANTEES.md, "Faults"):

* **Weights**: a lease that names a newer policy version has its weights loaded on the generating
  thread after the previous batch's generation and before its own; a batch is reported under the
  version that generated it (captured when its generation began).
* **Deadlines and the counting rule**: a lease is asked for ahead only when the lease length
  (its deadline minus the clock when it arrived; the last lease's) exceeds ``2 g + f``: the rest
  of the current generation, its own, and its report, with ``g`` and ``f`` the last batch's
  generation and verify-and-report seconds. When its turn comes, a lease held ahead whose time
  left is at most ``g + f`` is released at once (a report with no outcomes ends it; its problems
  return where they were with unchanged statistics) and a fresh one is leased. The server would
  refuse a late report anyway (the counting rule); this keeps generation from being spent on one.
  The deadline is the server's Unix time, so the rule assumes clocks in step (NTP).
* **max_batches**: no lease is asked for ahead of the last batch.
* **Stop** (:attr:`RolloutWorker.stop_event`: SIGTERM): the batch generating is finished and every
  generated batch reported; a lease held ahead is released. Past ``grace_s`` (the main thread's
  ``KeyboardInterrupt``) the loop leaves at once, as the sequential one does; unreported leases
  expire on the server.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from prioreplay.errors import PrioreplayError

if TYPE_CHECKING:  # pragma: no cover
    from prioreplay.v1 import priority_service_pb2 as pb

    from .batch import BatchResult, GeneratedBatch
    from .worker import RolloutWorker

log = logging.getLogger("prioreplay.worker")

T = TypeVar("T")

#: Seconds a wait for a background call sleeps between checks of a pending interrupt.
JOIN_POLL_S = 0.25


class Background(Generic[T]):
    """``fn(*args)`` on a daemon thread of its own; :meth:`result` waits and returns its value or
    raises its exception.

    Daemon threads (not a ``ThreadPoolExecutor``, whose threads the interpreter joins at exit): a
    worker interrupted past ``grace_s`` exits without waiting for a report in flight.
    """

    def __init__(self, fn: Callable[..., T], *args: Any, name: str):
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[..., T], args: tuple[Any, ...]) -> None:
        try:
            self._value = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller of result()
            self._error = e

    def done(self) -> bool:
        """True once the call has returned or raised."""
        return not self._thread.is_alive()

    def result(self) -> T:
        """The call's value, after waiting for it (a pending ``KeyboardInterrupt`` is raised
        within :data:`JOIN_POLL_S` seconds).

        Raises:
            BaseException: whatever the call raised.
        """
        while self._thread.is_alive():
            self._thread.join(JOIN_POLL_S)
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set by _run when no error was raised


class PipelinedLoop:
    """:meth:`RolloutWorker.run` with leasing and reporting overlapped with generation (module docstring).

    Args:
        worker: the worker whose backend, client, config and metrics the loop uses.
        clock: Unix time in seconds, compared with the leases' ``lease_deadline_unix_s``.

    Attributes:
        released: leases handed back unused (held ahead past their time, or at a stop).
        last_result: the last batch's :class:`BatchResult` (None before the first report).
    """

    def __init__(self, worker: RolloutWorker, clock: Callable[[], float] = time.time):
        self.worker = worker
        self.clock = clock
        self.released = 0
        self.last_result: BatchResult | None = None
        self._ahead: Background[pb.SampleProblemsResponse] | None = None
        self._finishing: Background[BatchResult] | None = None
        self._lease_s = math.inf  # length of the last lease, seconds (inf: no deadline seen)
        self._generation_s = 0.0  # the last batch's generation, seconds
        self._finish_s = 0.0  # the last batch's verify + report, seconds

    def run(self) -> int:
        """Lease, generate and report until ``max_batches`` batches or the stop event; returns 0.

        An unreachable server (after the client's retries) is logged and retried after
        ``max_retry_sleep_s``; empty leases sleep the server's ``retry_after_s`` (capped).

        Raises:
            InvalidArgument: the server refused the request as malformed (a bad setting).
            PartialWeightsLoad: the backend applied only part of a version (generated batches
                are still reported, a lease held ahead released).
        """
        interrupted = False
        try:
            self._loop()
        except KeyboardInterrupt:
            interrupted = True  # past grace_s: leave at once, the leases expire on the server
            raise
        finally:
            if not interrupted:
                self.drain()
        log.info("stopping after %d batches", self.worker.batches_done)
        return 0

    def _loop(self) -> None:
        w, c = self.worker, self.worker.config
        while not w.stop_event.is_set():
            if c.max_batches and w.batches_done >= c.max_batches:
                break
            try:
                lease = self._take_ahead()
                if lease is None:
                    lease = self._lease()
            except PrioreplayError as e:
                w.wait_out(e)
                continue
            if not lease.problems:
                res = w.empty_result(lease)
                w._sleep(min(res.retry_after_s, c.max_retry_sleep_s))
                continue
            self._step(lease)

    def _step(self, lease: pb.SampleProblemsResponse) -> None:
        """Load the lease's weights, ask for the next lease, generate, hand the batch to a reporter."""
        w = self.worker
        reload_s = w.maybe_reload(lease.policy_version, lease.weights_uri)  # never while a batch generates
        if self._should_lease_ahead():
            self._ahead = Background(self._lease, name="prioreplay-lease-ahead")
        batch = w.generate_lease(lease, reload_s)
        self._generation_s = batch.generation_s
        self._collect()  # the previous batch was verified and reported while this one generated
        self._finishing = Background(self._finish, batch, name="prioreplay-report")

    def _should_lease_ahead(self) -> bool:
        """True when a lease asked for now would still cover its own generation and report at its turn."""
        w, c = self.worker, self.worker.config
        if w.stop_event.is_set() or (c.max_batches and w.batches_done + 1 >= c.max_batches):
            return False
        need = 2 * self._generation_s + self._finish_s
        if self._lease_s <= need:
            log.debug("lease length %.1f s <= %.1f s (2 generations + a report): not leasing ahead", self._lease_s, need)
            return False
        return True

    def _lease(self) -> pb.SampleProblemsResponse:
        """One ``SampleProblems``; records the lease's length from its deadline."""
        lease = self.worker.lease()
        if lease.problems and lease.lease_deadline_unix_s > 0:
            self._lease_s = lease.lease_deadline_unix_s - self.clock()
        return lease

    def _take_ahead(self) -> pb.SampleProblemsResponse | None:
        """The lease held ahead, or None (none held, or released because too little of it is left).

        Raises:
            PrioreplayError: asking for it failed (after the client's retries).
        """
        if self._ahead is None:
            return None
        job, self._ahead = self._ahead, None
        lease = job.result()
        if not lease.problems or lease.lease_deadline_unix_s <= 0:
            return lease
        left, need = lease.lease_deadline_unix_s - self.clock(), self._generation_s + self._finish_s
        if left > need:
            return lease
        log.info(
            "lease %s has %.1f s left, not more than a generation and report (%.1f s): released", lease.lease_id[:8], left, need
        )
        self._release(lease)
        return None

    def _finish(self, batch: GeneratedBatch) -> BatchResult:
        t0 = time.perf_counter()
        res = self.worker.finish(batch)
        self._finish_s = time.perf_counter() - t0
        return res

    def _collect(self) -> None:
        """Wait for the batch being verified and reported, if any."""
        if self._finishing is not None:
            job, self._finishing = self._finishing, None
            self.last_result = job.result()

    def _release(self, lease: pb.SampleProblemsResponse) -> None:
        self.worker.release(lease)
        self.released += 1

    def drain(self) -> None:
        """Report the batch in flight and release a lease held ahead (at a stop, or on an error)."""
        try:
            self._collect()
        finally:
            if self._ahead is not None:
                job, self._ahead = self._ahead, None
                try:
                    lease = job.result()
                except PrioreplayError as e:
                    log.warning("the lease asked for ahead failed (%s); nothing to release", e)
                else:
                    if lease.problems:
                        self._release(lease)
