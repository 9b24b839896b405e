"""The gRPC servicer of ``prioreplay.v1.PriorityService``: a thin layer over a :class:`Store`.

It converts messages to the store's dataclasses and back, checks what only the messages show
(log-probabilities against token ids, NaN log-probabilities, negative policy versions, oversized
worker ids, the range of ``wait_s``), and maps :mod:`prioreplay.errors` to status codes with the
error's message as details. Everything else (batch sizes, rewards, lease rules, problem fields) is
validated once, by the store, identically for both stores.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import TYPE_CHECKING, AsyncIterator

import grpc
from google.protobuf.message import DecodeError
import numpy as np

from prioreplay.errors import InvalidArgument, PrioreplayError, StoreUnavailable
from prioreplay.priority_server import rules
from prioreplay.priority_server.store import (
    KNOWN_VERIFIERS,
    GroupOutcome,
    Lease,
    ProblemRecord,
    Store,
    validate_problem,
)
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc

if TYPE_CHECKING:  # pragma: no cover
    from prioreplay.priority_server.metrics import ServerMetrics

log = logging.getLogger(__name__)

#: Longest ``wait_s`` of PullTrajectories, seconds (the proto's limit).
MAX_WAIT_S = 60.0
#: Longest worker id / consumer name, bytes.
MAX_NAME_BYTES = 128
#: Longest weights URI, bytes.
MAX_URI_BYTES = 4096
#: A behaviour log-probability may exceed 0 by this much (float32 rounding of log-softmax), nats.
LOGPROB_TOLERANCE = 1e-3
#: Poll backoff of a waiting PullTrajectories: first and longest sleep, seconds.
PULL_BACKOFF_S = (0.005, 0.1)
#: Histogram buckets GetStats uses when the request leaves ``histogram_buckets`` at 0.
DEFAULT_BUCKETS = 10


def _check_name(value: str, field: str) -> None:
    n = len(value.encode("utf-8"))
    if n > MAX_NAME_BYTES:
        raise InvalidArgument(f"{field} is {n} bytes; the limit is {MAX_NAME_BYTES}; use a shorter name")


def problem_from_proto(p: pb.Problem) -> ProblemRecord:
    """The store's record of a proto ``Problem`` (an empty verifier means ``exact``)."""
    return ProblemRecord(id=p.id, prompt=p.prompt, answer=p.answer, verifier=p.verifier or "exact",
                         metadata=dict(p.metadata))


def problem_to_proto(r: ProblemRecord) -> pb.Problem:
    """The proto ``Problem`` of a store record."""
    return pb.Problem(id=r.id, prompt=r.prompt, answer=r.answer, verifier=r.verifier, metadata=r.metadata)


def lease_to_proto(lease: Lease) -> pb.SampleProblemsResponse:
    """The SampleProblems response of a store :class:`Lease`."""
    return pb.SampleProblemsResponse(
        lease_id=lease.lease_id,
        lease_deadline_unix_s=lease.deadline if lease.problems else 0.0,
        problems=[pb.LeasedProblem(problem=problem_to_proto(s.problem), priority=s.priority, source=int(s.source))
                  for s in lease.problems],
        policy_version=lease.policy_version,
        weights_uri=lease.weights_uri,
        retry_after_s=lease.retry_after_s,
        step=lease.step,
    )


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes, wanted: int):
    """Yield the payload bytes of every length-delimited field ``wanted`` of a serialized message."""
    pos, n = 0, len(buf)
    while pos < n:
        tag, pos = _varint(buf, pos)
        wire = tag & 7
        if wire == 0:
            _, pos = _varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if tag >> 3 == wanted:
                yield buf[pos:pos + size]
            pos += size
        else:  # groups (3, 4) are not used by proto3
            raise ValueError(f"unexpected wire type {wire}")


_COMPLETIONS_FIELD = pb.ProblemOutcome.DESCRIPTOR.fields_by_name["completions"].number
_LOGPROBS_FIELD = pb.Completion.DESCRIPTOR.fields_by_name["logprobs"].number


def logprobs_all_valid(outcomes) -> bool:
    """True when every log-probability of every completion is finite and <= 0 (+ tolerance).

    One vectorised check over the packed float32 bytes of the re-serialized outcomes: turning
    repeated protobuf floats into Python floats one by one costs ~0.5 µs each, which at
    256 problems × G = 8 × 128 tokens is most of a report's handling time.
    """
    parts = [lp for o in outcomes for c in _fields(o.SerializeToString(), _COMPLETIONS_FIELD)
             for lp in _fields(c, _LOGPROBS_FIELD)]
    if not parts:
        return True
    a = np.frombuffer(b"".join(parts), dtype="<f4")
    return bool(np.isfinite(a).all() and a.max() <= LOGPROB_TOLERANCE)


def validate_outcome(o: pb.ProblemOutcome, index: int, check_values: bool = True) -> None:
    """Message-level checks of one reported group (the store checks rewards and membership).

    Raises:
        InvalidArgument: empty problem id, negative policy_version, a completion whose logprobs
            length differs from its token_ids length, or a log-probability that is NaN, infinite
            or above 0 (beyond :data:`LOGPROB_TOLERANCE`). The message names the outcome and
            completion index. ``check_values=False`` skips the per-value scan (the servicer checks
            all values at once with :func:`logprobs_all_valid` and rescans only a bad report).
    """
    where = f"outcomes[{index}] (problem {o.problem_id!r})"
    if not o.problem_id:
        raise InvalidArgument(f"outcomes[{index}]: problem_id is empty; quote the id of a leased problem")
    if o.policy_version < 0:
        raise InvalidArgument(f"{where}: policy_version ({o.policy_version}) must be >= 0")
    if not (math.isfinite(o.sampling_temperature) and o.sampling_temperature >= 0):
        raise InvalidArgument(f"{where}: sampling_temperature ({o.sampling_temperature}) must be a finite number "
                              ">= 0 (0: not sent)")
    for j, c in enumerate(o.completions):
        lps = c.logprobs
        if len(lps) != len(c.token_ids):
            raise InvalidArgument(
                f"{where} completions[{j}]: {len(lps)} logprobs for {len(c.token_ids)} token_ids; "
                "send one behaviour log-probability per generated token"
            )
        if check_values:
            for k, lp in enumerate(lps):
                if not (math.isfinite(lp) and lp <= LOGPROB_TOLERANCE):
                    raise InvalidArgument(
                        f"{where} completions[{j}].logprobs[{k}] = {lp!r}: log-probabilities must be finite "
                        "and <= 0 nats"
                    )


def outcome_to_group(o: pb.ProblemOutcome, reported_unix_s: float) -> GroupOutcome:
    """The store's :class:`GroupOutcome` of a proto outcome.

    The payload (a serialized ``TrajectoryGroup`` without group_id / delivery_count, stamped with
    ``reported_unix_s``) is built only for mixed groups, the only ones the store queues; the
    store still validates every group's rewards.
    """
    rewards = tuple(c.reward for c in o.completions)
    payload = b""
    if rewards and rules.classify(rewards) is rules.GroupKind.MIXED:
        payload = pb.TrajectoryGroup(problem_id=o.problem_id, policy_version=o.policy_version,
                                     prompt_token_ids=o.prompt_token_ids, completions=o.completions,
                                     reported_unix_s=reported_unix_s,
                                     sampling_temperature=o.sampling_temperature).SerializeToString()
    return GroupOutcome(problem_id=o.problem_id, rewards=rewards, payload=payload)


class PriorityServicer(pb_grpc.PriorityServiceServicer):
    """``prioreplay.v1.PriorityService`` on grpc.aio, backed by a :class:`Store`.

    Args:
        store: the problem statistics, leases and trajectory queue.
        metrics: optional; receives the priorities of served problems.

    Every RPC ends with the status code of the :mod:`prioreplay.errors` class it raised
    (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, RESOURCE_EXHAUSTED, UNAVAILABLE) and the
    error's message as details; an unexpected exception is logged and answered INTERNAL.
    """

    def __init__(self, store: Store, metrics: "ServerMetrics | None" = None):
        self.store = store
        self.metrics = metrics

    async def _fail(self, context: grpc.aio.ServicerContext, method: str, e: BaseException) -> None:
        if isinstance(e, PrioreplayError):
            code = getattr(grpc.StatusCode, e.GRPC_CODE, grpc.StatusCode.UNKNOWN)
            if isinstance(e, StoreUnavailable):
                log.warning("%s: store unavailable: %s", method, e)
            await context.abort(code, str(e))
        if isinstance(e, DecodeError):  # undecodable bytes of a streamed chunk: the client's fault
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: a request message is not valid protobuf ({e})")
        log.exception("%s: unexpected error", method, exc_info=e)
        await context.abort(grpc.StatusCode.INTERNAL, f"{method}: internal error ({type(e).__name__}); see the server log")

    # -- RPCs -----------------------------------------------------------------------------
    async def RegisterProblems(self, request_iterator: AsyncIterator[pb.RegisterProblemsRequest],
                               context) -> pb.RegisterProblemsResponse:
        """Upsert the stream's problems chunk by chunk; a bad chunk is refused whole, earlier ones stay."""
        created = updated = 0
        total: int | None = None
        offset = 0
        try:
            async for chunk in request_iterator:
                records = [problem_from_proto(p) for p in chunk.problems]
                if not records:
                    continue
                try:
                    c, u, total = await self.store.register(records)
                except InvalidArgument:
                    for i, r in enumerate(records):  # name the index in the whole stream
                        validate_problem(r, offset + i, KNOWN_VERIFIERS)
                    raise
                offset += len(records)
                created += c
                updated += u
            if total is None:  # an empty stream: report the count
                _, _, total = await self.store.register([])
        except Exception as e:  # noqa: BLE001 - mapped to a status code
            await self._fail(context, "RegisterProblems", e)
        return pb.RegisterProblemsResponse(created=created, updated=updated, total=total)

    async def SampleProblems(self, request: pb.SampleProblemsRequest, context) -> pb.SampleProblemsResponse:
        """Lease up to ``batch_size`` problems (the store checks the size and the lease length)."""
        try:
            _check_name(request.worker_id, "worker_id")
            lease = await self.store.sample(request.batch_size, request.lease_timeout_s)
        except Exception as e:  # noqa: BLE001
            await self._fail(context, "SampleProblems", e)
        if self.metrics is not None and lease.problems:
            self.metrics.observe_sampled([s.priority for s in lease.problems])
        return lease_to_proto(lease)

    async def ReportOutcomes(self, request: pb.ReportOutcomesRequest, context) -> pb.ReportOutcomesResponse:
        """Apply a lease's groups; late or repeated reports answer ``accepted = false``."""
        try:
            _check_name(request.worker_id, "worker_id")
            if not request.lease_id:
                raise InvalidArgument("lease_id is empty; quote the lease_id returned by SampleProblems")
            for i, o in enumerate(request.outcomes):
                validate_outcome(o, i, check_values=False)
            if not logprobs_all_valid(request.outcomes):
                for i, o in enumerate(request.outcomes):  # find the bad value for the message
                    validate_outcome(o, i)
            now = self.store.clock()
            groups = [outcome_to_group(o, now) for o in request.outcomes]
            result = await self.store.report(request.lease_id, groups)
        except Exception as e:  # noqa: BLE001
            await self._fail(context, "ReportOutcomes", e)
        if not result.accepted:
            log.info("late report from worker %r: %s", request.worker_id[:MAX_NAME_BYTES], result.reason)
        return pb.ReportOutcomesResponse(accepted=result.accepted, reason=result.reason,
                                         groups_queued=result.groups_queued, groups_filtered=result.groups_filtered)

    async def PullTrajectories(self, request: pb.PullTrajectoriesRequest, context) -> pb.PullTrajectoriesResponse:
        """Deliver up to ``max_groups`` groups, polling the store for up to ``wait_s`` seconds."""
        try:
            wait_s = request.wait_s
            if not (math.isfinite(wait_s) and 0.0 <= wait_s <= MAX_WAIT_S):
                raise InvalidArgument(f"wait_s ({wait_s}) must be a number of seconds in [0, {MAX_WAIT_S:g}]")
            deadline = time.monotonic() + wait_s
            sleep_s = PULL_BACKOFF_S[0]
            own = request.include_own_pending
            while True:
                deliveries = await self.store.pull(request.consumer, request.max_groups, own)
                own = False  # own pending groups were handed back by the first poll
                left = deadline - time.monotonic()
                if deliveries or left <= 0:
                    break
                await asyncio.sleep(min(sleep_s, left))
                sleep_s = min(sleep_s * 2, PULL_BACKOFF_S[1])
            groups = []
            for d in deliveries:
                g = pb.TrajectoryGroup.FromString(d.payload)
                g.group_id = d.group_id
                g.delivery_count = d.delivery_count
                groups.append(g)
            depth = await self.store.queue_depth()
        except Exception as e:  # noqa: BLE001
            await self._fail(context, "PullTrajectories", e)
        return pb.PullTrajectoriesResponse(groups=groups, queue_depth=depth)

    async def AckTrajectories(self, request: pb.AckTrajectoriesRequest, context) -> pb.AckTrajectoriesResponse:
        """Acknowledge groups; unknown or repeated ids are counted, not errors."""
        try:
            acked, unknown = await self.store.ack(list(request.group_ids))
        except Exception as e:  # noqa: BLE001
            await self._fail(context, "AckTrajectories", e)
        return pb.AckTrajectoriesResponse(acked=acked, unknown=unknown)

    async def PublishPolicy(self, request: pb.PublishPolicyRequest, context) -> pb.PublishPolicyResponse:
        """Publish a policy version (versions never go backwards)."""
        try:
            n = len(request.weights_uri.encode("utf-8"))
            if n > MAX_URI_BYTES:
                raise InvalidArgument(f"weights_uri is {n} bytes; the limit is {MAX_URI_BYTES}")
            version, uri = await self.store.publish(request.version, request.weights_uri)
        except Exception as e:  # noqa: BLE001
            await self._fail(context, "PublishPolicy", e)
        return pb.PublishPolicyResponse(version=version, weights_uri=uri)

    async def GetStats(self, request: pb.GetStatsRequest, context) -> pb.GetStatsResponse:
        """Pool sizes, the priority histogram and the store's counters."""
        try:
            s = await self.store.stats(request.histogram_buckets or DEFAULT_BUCKETS)
        except Exception as e:  # noqa: BLE001
            await self._fail(context, "GetStats", e)
        return stats_to_proto(s)


def stats_to_proto(s) -> pb.GetStatsResponse:
    """The GetStats response of a :class:`StoreStats`."""
    return pb.GetStatsResponse(
        problems=s.problems, heap_size=s.heap_size, solved=s.solved, unsolved=s.unsolved, leased=s.leased,
        active_leases=s.active_leases, step=s.step, policy_version=s.policy_version, weights_uri=s.weights_uri,
        priority_histogram=s.priority_histogram, priority_bucket_edges=s.priority_bucket_edges,
        groups_mixed=s.groups_mixed, groups_all_correct=s.groups_all_correct, groups_all_wrong=s.groups_all_wrong,
        groups_constant=s.groups_constant, effective_group_fraction=s.effective_group_fraction,
        forgetting_events=s.forgetting_events, breakthroughs=s.breakthroughs, lease_expiries=s.lease_expiries,
        queue_depth=s.queue_depth, pending_groups=s.pending_groups, completions_reported=s.completions_reported,
        reward_sum=s.reward_sum, late_reports=s.late_reports, groups_acked=s.groups_acked,
    )


__all__ = ["PriorityServicer", "lease_to_proto", "stats_to_proto", "validate_outcome",
           "outcome_to_group", "problem_from_proto", "problem_to_proto"]
