"""The gRPC servicer of ``prioreplay.v1.PriorityService``: a thin layer over a :class:`Store`.

It converts messages to the store's dataclasses and back (through :mod:`prioreplay.convert`), checks what only the messages show
(log-probabilities against token ids, NaN log-probabilities, negative policy versions, oversized
worker ids, the range of ``wait_s``), and maps :mod:`prioreplay.errors` to status codes with the
error's message as details. Everything else (batch sizes, rewards, lease rules, problem fields) is
validated once, by the store, identically for both stores.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import grpc
from google.protobuf.message import DecodeError

from prioreplay.config import MAX_MESSAGE_MB_DEFAULT
from prioreplay.convert import problem_from_proto, stats_to_proto
from prioreplay.errors import FailedPrecondition, Internal, InvalidArgument, PrioreplayError, ResourceExhausted, StoreUnavailable
from prioreplay.problems import check_name, problem_task, validate_problem
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc

from .client_traffic import ClientTally
from .pacing import Pacing
from .samplers import SAMPLERS
from .store import Store
from .store.identity import NamespaceLost
from .store.records import Delivery
from .wire import lease_response, pull_response, pulled_group, report_groups

if TYPE_CHECKING:  # pragma: no cover
    from .metrics import ServerMetrics

log = logging.getLogger(__name__)
R = TypeVar("R")

#: The full gRPC name of the service (``prioreplay.v1.PriorityService``).
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["PriorityService"].full_name

#: Longest ``wait_s`` of PullTrajectories, seconds (the proto's limit).
MAX_WAIT_S = 60.0
#: Longest weights URI, bytes.
MAX_URI_BYTES = 4096
#: Histogram buckets GetStats uses when the request leaves ``histogram_buckets`` at 0.
DEFAULT_BUCKETS = 10
#: Bytes of a PullTrajectories answer kept free of groups (queue_depth, framing), bytes.
RESPONSE_MARGIN_BYTES = 1024


def rpc(method: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """Map whatever an RPC method raises to its status code (one place for all of them).

    A :mod:`prioreplay.errors` class ends the call with its ``GRPC_CODE`` and its message as
    details (a store outage, UNAVAILABLE, and a store logic error, INTERNAL, also go to
    :meth:`PriorityServicer.store_failed`: counted, logged, health NOT_SERVING on an outage).
    While the store's namespace is lost (``Store.namespace_lost``) every call ends with that
    error, FAILED_PRECONDITION, before the method runs;
    undecodable bytes of a streamed request with INVALID_ARGUMENT; anything else is logged with its traceback
    and answered INTERNAL.
    Cancellation and an abort the method made itself pass through unchanged.
    """
    name = method.__name__

    @functools.wraps(method)
    async def wrapper(self, request, context):
        try:
            if self.pending_check is not None:  # run settings not checked yet (the store was down at start)
                await self.pending_check()
            lost = self.store.namespace_lost
            if lost is not None:  # nothing is served from a lost namespace (no empty lease)
                raise lost.copy()
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except PrioreplayError as e:
            if isinstance(e, (StoreUnavailable, Internal, NamespaceLost)):
                self.store_failed(e, name)
            await context.abort(getattr(grpc.StatusCode, e.GRPC_CODE, grpc.StatusCode.UNKNOWN), str(e))
        except DecodeError as e:  # undecodable bytes of a streamed chunk: the client's fault
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: a request message is not valid protobuf ({e})")
        except Exception as e:  # noqa: BLE001 - a bug: logged, answered INTERNAL
            log.exception("%s: unexpected error", name, exc_info=e)
            await context.abort(grpc.StatusCode.INTERNAL, f"{name}: internal error ({type(e).__name__}); see the server log")

    return wrapper


class PriorityServicer(pb_grpc.PriorityServiceServicer):
    """``prioreplay.v1.PriorityService`` on grpc.aio, backed by a :class:`Store`.

    Args:
        store: the problem statistics, leases and trajectory queue.
        metrics: optional; receives the priorities of served problems and the traffic per kind of
            client (without metrics the servicer keeps its own :class:`ClientTally` for GetStats).
        max_message_mb: the server's gRPC message limit, MiB (``--max-message-mb``); a
            PullTrajectories answer is cut to fit it.
        pacing: the lease gate (:mod:`.pacing`): the queue bound (SampleProblems answers an empty
            batch with ``backpressure = true``) and the pace bound (a call waits for room, then
            answers ``paced = true``); default: a gate with no queue bound and the store's pace bound.

    Every RPC ends with the status code of the :mod:`prioreplay.errors` class it raised
    (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, RESOURCE_EXHAUSTED, UNAVAILABLE) and the
    error's message as details; an unexpected exception is logged and answered INTERNAL (:func:`rpc`).
    """

    def __init__(
        self,
        store: Store,
        metrics: ServerMetrics | None = None,
        max_message_mb: int = MAX_MESSAGE_MB_DEFAULT,
        pacing: Pacing | None = None,
    ):
        self.store = store
        self.max_message_mb = max_message_mb
        self.metrics = metrics
        self.pacing = pacing if pacing is not None else Pacing(store, metrics=metrics)
        self.clients = metrics.clients if metrics is not None else ClientTally()
        #: Called (no arguments) when an RPC meets a store outage; the server factory sets it to
        #: turn the health status NOT_SERVING at once (the periodic refresh turns it back).
        self.on_store_unavailable: Callable[[], None] | None = None
        #: Called (no arguments) after a RegisterProblems stream is stored; a server process sets
        #: it to ``gc.freeze`` (:func:`.server.create_server`, ``freeze_gc``).
        self.on_registered: Callable[[], None] | None = None
        #: Awaited before every RPC while set: the server factory's deferred check of the run
        #: settings (it raises FailedPrecondition on a mismatch, StoreUnavailable while the store is down).
        self.pending_check: Callable[[], Awaitable[None]] | None = None

    def store_failed(self, e: PrioreplayError, method: str) -> None:
        """A store error ended ``method``: count it by kind, log one line, report an outage.

        An outage (:class:`StoreUnavailable`) is a warning and calls :attr:`on_store_unavailable`;
        a logic error (:class:`Internal`) is an error line naming the store's answer. A lost namespace
        (:class:`.store.identity.NamespaceLost`, logged by the store when found) calls
        :attr:`on_store_unavailable` only (health NOT_SERVING at once; counted as a loss, not a store error).
        """
        if isinstance(e, NamespaceLost):  # logged and counted by the store and the runtime
            if self.on_store_unavailable is not None:
                self.on_store_unavailable()
            return
        kind = getattr(e, "kind", "logic") if isinstance(e, StoreUnavailable) else "logic"
        if self.metrics is not None:
            self.metrics.store_errors.labels(kind).inc()
        if isinstance(e, StoreUnavailable):
            log.warning("%s: store unavailable (%s): %s", method, kind, e)
            if self.on_store_unavailable is not None:
                self.on_store_unavailable()
        else:
            log.error("%s: store error answered INTERNAL: %s", method, e)

    @rpc
    async def RegisterProblems(
        self, request_iterator: AsyncIterator[pb.RegisterProblemsRequest], context
    ) -> pb.RegisterProblemsResponse:
        """Upsert the stream's problems chunk by chunk; a bad chunk is refused whole, earlier ones stay.

        An id that holds another prompt or answer refuses its chunk unless the chunk sets ``replace``.
        """
        created = updated = 0
        total: int | None = None
        offset = 0
        async for chunk in request_iterator:
            records = [problem_from_proto(p) for p in chunk.problems]
            if not records:
                continue
            try:
                c, u, total = await self.store.register(records, replace=chunk.replace)
            except InvalidArgument:
                for i, r in enumerate(records):  # name the index in the whole stream
                    validate_problem(r, offset + i)
                raise
            offset += len(records)
            created += c
            updated += u
        if total is None:  # an empty stream: report the count
            _, _, total = await self.store.register([])
        if self.on_registered is not None:
            self.on_registered()
        return pb.RegisterProblemsResponse(created=created, updated=updated, total=total)

    @rpc
    async def SampleProblems(self, request: pb.SampleProblemsRequest, context) -> pb.SampleProblemsResponse | bytes:
        """Lease up to ``batch_size`` problems (the store checks the size and the lease length).

        A lease is answered as the serialized ``SampleProblemsResponse`` (the server registers
        this method with a pass-through serializer, :func:`.server.method_handlers`), written from
        each problem's ``Problem`` bytes (:func:`.wire.lease_response`, byte for byte the message
        :func:`~prioreplay.convert.lease_to_proto` gives, plus ``pace_wait_s`` when the pace bound
        held the call); a refusal of the queue bound, or of the pace bound after its wait, as a
        message (:mod:`.pacing`).
        """
        check_name(request.worker_id, "worker_id")
        check_name(request.request_id, "request_id")
        sampler = self.store.config.sampler
        if SAMPLERS[sampler].probes and not request.accepts_group_size:
            raise FailedPrecondition(
                f"the server's sampler {sampler!r} asks for screening probes (a per-problem group_size) and this "
                "client does not declare accepts_group_size; upgrade the worker, or run the server with a "
                "sampler without probes (e.g. --sampler heap)"
            )
        key = f"{request.worker_id}\t{request.request_id}" if request.request_id else ""  # ids are per client
        pacing = self.pacing
        if await pacing.refuse():
            if self.metrics is not None:
                self.metrics.backpressure_refusals.inc()
            return pb.SampleProblemsResponse(retry_after_s=pacing.retry_s, backpressure=True)
        time_left = getattr(context, "time_remaining", lambda: None)()  # None: the call has no deadline
        lease, waited = await pacing.sample(request.batch_size, request.lease_timeout_s, key, request.worker_id, time_left)
        if lease.paced:  # no room for the whole wait: ask again (pacing.py)
            return pb.SampleProblemsResponse(paced=True, pace_wait_s=waited, retry_after_s=pacing.retry_after(waited))
        if lease.problems:
            self.clients.sampled(request.client_source, len(lease.problems))
            if self.metrics is not None:
                self.metrics.observe_sampled(
                    [s.priority for s in lease.problems],
                    sum(1 for s in lease.problems if s.group_size),
                    [problem_task(s.problem) for s in lease.problems],
                )
        tail = pb.SampleProblemsResponse(pace_wait_s=waited).SerializeToString() if waited else b""
        return lease_response(lease) + tail  # serialized messages concatenate as a merge

    @rpc
    async def ReportOutcomes(self, request: pb.ReportOutcomesRequest | bytes, context) -> pb.ReportOutcomesResponse:
        """Apply a lease's groups; late or repeated reports answer ``accepted = false``.

        The server registers this method without a request deserializer (:func:`.server.method_handlers`),
        so ``request`` arrives as the received bytes; a decoded message (a direct call) is
        re-serialized, and both are read by the one report decode, :func:`.wire.report_groups`.
        ``more_parts``: one part of a report sent in several (see ``Store.report``).
        """
        if isinstance(request, bytes):
            raw = request
            request = pb.ReportOutcomesRequest.FromString(raw)  # DecodeError: INVALID_ARGUMENT (rpc)
        else:
            raw = request.SerializeToString()
        check_name(request.worker_id, "worker_id")
        if not request.lease_id:
            raise InvalidArgument("lease_id is empty; quote the lease_id returned by SampleProblems")
        now = self.store.clock()
        queue = not request.rewards_only
        groups = report_groups(raw, request, now, queue, zero_variance=self.store.config.queue_zero_variance)
        unservable = list(request.unservable_problem_ids)
        result = await self.store.report(request.lease_id, groups, more_parts=request.more_parts, unservable=unservable)
        await self.pacing.reported(result, len(groups) + len(unservable), request.more_parts)
        if result.quarantined:
            log.warning(
                "worker %r reported %d problem(s) unservable (prompt over its model's context); quarantined "
                "until registered again: %s",
                request.worker_id,
                result.quarantined,
                ", ".join(unservable[:10]),
            )
            if self.metrics is not None:
                self.metrics.problems_quarantined.inc(result.quarantined)
        self.clients.reported(request.client_source, result.accepted, [g.rewards for g in groups], result.kinds)
        if not result.accepted:
            log.info("late report from worker %r: %s", request.worker_id, result.reason)
        return pb.ReportOutcomesResponse(
            accepted=result.accepted,
            reason=result.reason,
            groups_queued=result.groups_queued,
            groups_filtered=result.groups_filtered,
            problems_quarantined=result.quarantined,
        )

    @rpc
    async def RenewLease(self, request: pb.RenewLeaseRequest, context) -> pb.RenewLeaseResponse:
        """Extend a live lease of the request's worker (NOT_FOUND: not live; FAILED_PRECONDITION: another worker's)."""
        check_name(request.worker_id, "worker_id")
        renewal = await self.store.renew(request.lease_id, request.worker_id, request.lease_timeout_s)
        return pb.RenewLeaseResponse(lease_deadline_unix_s=renewal.deadline, problems=renewal.problems)

    @rpc
    async def PullTrajectories(self, request: pb.PullTrajectoriesRequest, context) -> bytes:
        """Deliver up to ``max_groups`` groups, waiting up to ``wait_s`` seconds for the first one
        (woken by the report that queues it, :meth:`Store.pull`; never polled).

        Answers the serialized ``PullTrajectoriesResponse`` (the server registers this method with
        a pass-through serializer, :func:`.server.method_handlers`): each group goes out as the
        bytes it was queued as plus its delivery fields (:func:`.wire.pulled_group`). The answer
        holds as many of the delivered groups as fit under the smaller of the server's
        ``--max-message-mb`` and the request's ``max_response_bytes``; the rest are handed back to
        the store (:meth:`Store.release`), so the next pull delivers them first. A first group
        that alone does not fit is handed back too and the call ends with RESOURCE_EXHAUSTED
        naming ``--max-message-mb``.
        """
        wait_s = request.wait_s
        if not (math.isfinite(wait_s) and 0.0 <= wait_s <= MAX_WAIT_S):
            raise InvalidArgument(f"wait_s ({wait_s}) must be a number of seconds in [0, {MAX_WAIT_S:g}]")
        await self.pacing.pulling(request.learner_batch_groups)  # the learner's batch, before the pull waits
        deliveries = await self.store.pull(request.consumer, request.max_groups, request.include_own_pending, wait_s=wait_s)
        await self.pacing.delivered(len(deliveries))
        server_limit = self.max_message_mb * 1024 * 1024
        limit = min(server_limit, request.max_response_bytes or server_limit)
        budget = limit - RESPONSE_MARGIN_BYTES
        groups: list[bytes] = []
        used = 0
        for i, d in enumerate(deliveries):
            g = pulled_group(d.payload, d.group_id, d.delivery_count)
            cost = len(g) + 11  # field tag and length prefix in the answer
            if used + cost > budget:
                await self.store.release(request.consumer, deliveries[i:])
                if not groups:
                    raise self._too_big(d, len(g), limit, server_limit)
                log.info(
                    "PullTrajectories: %d of %d groups fit under %.2f MiB; the rest are delivered next",
                    len(groups),
                    len(deliveries),
                    limit / 2**20,
                )
                break
            groups.append(g)
            used += cost
        return pull_response(groups, await self.store.queue_depth())

    @staticmethod
    def _too_big(d: Delivery, n: int, limit: int, server_limit: int) -> ResourceExhausted:
        """The error of a first group of ``n`` bytes that alone does not fit under ``limit``."""
        which = "this server's --max-message-mb"
        if limit != server_limit:
            which = "the learner's --max-message-mb (max_response_bytes)"
        problem_id = pb.TrajectoryGroup.FromString(d.payload).problem_id
        return ResourceExhausted(
            f"trajectory group {d.group_id} (problem {problem_id!r}) is {n / 2**20:.2f} MiB, over the "
            f"{limit / 2**20:.2f} MiB an answer may hold ({which}); raise --max-message-mb on both the "
            "server and the learner above it. The group stays queued"
        )

    @rpc
    async def AckTrajectories(self, request: pb.AckTrajectoriesRequest, context) -> pb.AckTrajectoriesResponse:
        """Acknowledge groups; unknown or repeated ids are counted, not errors."""
        acked, unknown = await self.store.ack(list(request.group_ids))
        return pb.AckTrajectoriesResponse(acked=acked, unknown=unknown)

    @rpc
    async def PublishPolicy(self, request: pb.PublishPolicyRequest, context) -> pb.PublishPolicyResponse:
        """Publish a policy version (versions never go backwards)."""
        n = len(request.weights_uri.encode("utf-8"))
        if n > MAX_URI_BYTES:
            raise InvalidArgument(f"weights_uri is {n} bytes; the limit is {MAX_URI_BYTES}")
        version, uri = await self.store.publish(request.version, request.weights_uri)
        return pb.PublishPolicyResponse(version=version, weights_uri=uri)

    @rpc
    async def GetStats(self, request: pb.GetStatsRequest, context) -> pb.GetStatsResponse:
        """Pool sizes, the priority histogram and the store's counters."""
        stats = await self.store.stats(request.histogram_buckets or DEFAULT_BUCKETS)
        return stats_to_proto(stats, self.clients.to_proto())


__all__ = ["PriorityServicer", "rpc"]
