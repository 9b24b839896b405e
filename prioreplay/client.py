"""A synchronous client of the priority server, used by workers, the learner and the CLI.

It sets explicit message-size limits, sends the bearer token as call credentials (over TLS) or
as metadata (plaintext, local use), retries UNAVAILABLE / DEADLINE_EXCEEDED with exponential
backoff and jitter, and maps status codes back to :mod:`prioreplay.errors`.
"""

from __future__ import annotations

import functools
import logging
import random
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

import grpc

from prioreplay.channel import client_channel_options, timed_call
from prioreplay.config import ClientSettings
from prioreplay.errors import ERRORS_BY_CODE, PrioreplayError, ResourceExhausted, StoreUnavailable
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
#: Bytes of a report message kept free of outcomes (lease id, worker id, framing).
REPORT_MARGIN_BYTES = 4096
#: Bytes an outcome adds to a report beyond its own size (field tag and length prefix, at most).
OUTCOME_FRAMING_BYTES = 8


def map_rpc_error(e: grpc.RpcError, method: str, max_message_mb: int | None = None) -> PrioreplayError:
    """Turn a gRPC error into the matching :mod:`prioreplay.errors` class.

    gRPC's own message-size refusals ("... message larger than max ...") get the setting that
    raises the limit appended: ``--max-message-mb`` of this client (``max_message_mb``) and of
    the server.
    """
    code = e.code().name if e.code() else "UNKNOWN"
    cls = ERRORS_BY_CODE.get(code, PrioreplayError)
    if code == "DEADLINE_EXCEEDED":
        cls = StoreUnavailable
    details = e.details() or code
    if code == "RESOURCE_EXHAUSTED" and "larger than max" in details.lower():
        mine = f"{max_message_mb} MiB here" if max_message_mb else "this client's"
        details += (
            f" (a gRPC message limit: --max-message-mb, {mine}; the server has its own --max-message-mb. "
            "Raise the limit of the side that refused, or send less per call)"
        )
    return cls(f"{method}: {details}")


def split_outcomes(outcomes: Sequence[pb.ProblemOutcome], limit_bytes: int) -> list[list[pb.ProblemOutcome]]:
    """Cut a report's outcomes into consecutive parts of at most ``limit_bytes`` serialized bytes each.

    Greedy and order-keeping: each outcome costs its ``ByteSize()`` plus
    :data:`OUTCOME_FRAMING_BYTES`; a part takes outcomes while they fit. An outcome larger than the
    limit alone gets a part of its own (the server decides about it). Always at least one part
    (``[[]]`` for no outcomes: an empty report still ends its lease).

    Raises:
        ValueError: ``limit_bytes`` < 1.
    """
    if limit_bytes < 1:
        raise ValueError(f"limit_bytes ({limit_bytes}) must be >= 1")
    parts: list[list[pb.ProblemOutcome]] = []
    part: list[pb.ProblemOutcome] = []
    size = 0
    for o in outcomes:
        n = o.ByteSize() + OUTCOME_FRAMING_BYTES
        if part and size + n > limit_bytes:
            parts.append(part)
            part, size = [], 0
        part.append(o)
        size += n
    parts.append(part)
    return parts


def _send_parts(
    lease_id: str,
    parts: list[list[pb.ProblemOutcome]],
    send: Callable[[list[pb.ProblemOutcome], bool], pb.ReportOutcomesResponse],
) -> pb.ReportOutcomesResponse:
    """Send a lease's ``parts`` in order with ``send(part, last)`` (:meth:`PriorityClient.report_lease`).

    A part the server refuses as too large is halved and sent again; a single outcome it still
    refuses is left out (logged); when that was the last part, an empty last part ends the lease.
    Stops at the first part not accepted. Returns the parts' counts summed (:func:`_add_part`).
    """
    total = pb.ReportOutcomesResponse(accepted=True)
    pending = deque((p, i == len(parts) - 1) for i, p in enumerate(parts))
    while pending:
        part, last = pending.popleft()
        try:
            resp = send(part, last)
        except ResourceExhausted as e:
            if len(part) > 1:  # the server's limit is lower: halve and send again
                half = len(part) // 2
                pending.extendleft([(part[half:], last), (part[:half], False)])
                continue
            log.error(
                "lease %s: problem %s alone is too large to report (%s); raise --max-message-mb on the "
                "server and this client; it returns unreported when the lease ends",
                lease_id,
                part[0].problem_id if part else "(none)",
                e,
            )
            if not last:
                continue
            resp = send([], True)  # the last part, empty: ends the lease
        _add_part(total, resp)
        if not resp.accepted:
            break
    return total


def _add_part(total: pb.ReportOutcomesResponse, resp: pb.ReportOutcomesResponse) -> None:
    """Fold one part's answer into the answer for the whole report (refused: its reason)."""
    total.groups_queued += resp.groups_queued
    total.groups_filtered += resp.groups_filtered
    total.problems_quarantined += resp.problems_quarantined
    if not resp.accepted:
        total.accepted, total.reason = False, resp.reason


class PriorityClient:
    """Blocking client of ``prioreplay.v1.PriorityService``.

    Args:
        settings: address, token, TLS CA, message limit and RPC deadline.
        max_retries: attempts after the first on UNAVAILABLE / DEADLINE_EXCEEDED (0: none).
        backoff_s: first retry delay, seconds; doubles each retry (with ±50% jitter), capped at 10 s.

    Every method raises the :mod:`prioreplay.errors` class of the status code:
    InvalidArgument, NotFound, FailedPrecondition, ResourceExhausted, Unauthenticated, and
    StoreUnavailable once retries are exhausted.
    """

    def __init__(
        self,
        settings: ClientSettings | None = None,
        *,
        max_retries: int = 8,
        backoff_s: float = 0.2,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.settings = settings or ClientSettings()
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self._sleep = sleep
        opts = client_channel_options(self.settings.server, self.settings.max_message_mb)
        token = self.settings.token()
        self._metadata: tuple[tuple[str, str], ...] = ()
        if self.settings.tls_ca_file is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=self.settings.tls_ca_file.read_bytes())
            if token:
                creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
            self.channel = grpc.secure_channel(self.settings.server, creds, options=opts)
        else:
            if token:  # plaintext: call credentials need TLS, so send the header ourselves
                self._metadata = (("authorization", f"Bearer {token}"),)
            self.channel = grpc.insecure_channel(self.settings.server, options=opts)
        self.stub = pb_grpc.PriorityServiceStub(self.channel)

    # -- plumbing -----------------------------------------------------------------------
    def _call(self, method: str, fn: Callable[..., T], *args, timeout: float | None = None) -> T:
        delay = self.backoff_s
        for attempt in range(self.max_retries + 1):
            try:
                return fn(*args, timeout=timeout or self.settings.rpc_timeout_s, metadata=self._metadata)
            except grpc.RpcError as e:
                if e.code() in RETRYABLE and attempt < self.max_retries:
                    wait = min(10.0, delay) * random.uniform(0.5, 1.5)
                    log.warning(
                        "%s: %s (%s); retry %d/%d in %.2fs",
                        method,
                        e.code().name,
                        e.details(),
                        attempt + 1,
                        self.max_retries,
                        wait,
                    )
                    self._sleep(wait)
                    delay *= 2
                    continue
                raise map_rpc_error(e, method, self.settings.max_message_mb) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> PriorityClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Block until the channel connects. Raises StoreUnavailable after ``timeout_s`` seconds."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            raise StoreUnavailable(f"priority server at {self.settings.server} did not answer within {timeout_s}s") from None

    # -- RPCs ---------------------------------------------------------------------------
    def register(
        self, problems: Iterable[pb.Problem], chunk_size: int = 512, replace: bool = False
    ) -> pb.RegisterProblemsResponse:
        """Stream problems in chunks of ``chunk_size``. Not retried (a stream is not replayable).

        ``replace``: a registered id with another prompt or answer takes the new text (statistics
        kept); without it such an id refuses its chunk.

        Raises:
            InvalidArgument: a malformed problem, or (without ``replace``) ids registered with
                another prompt or answer (the message names them, ``--id-prefix`` and ``--replace``).
            StoreUnavailable: the server or its store cannot be reached.
            Exception: whatever ``problems`` raised while it was read (e.g. InvalidArgument naming
                a dataset's file and line), unchanged; chunks sent before it stay registered.
        """

        failed: list[Exception] = []  # an error of the problems' own iterator (a malformed line, named file:line)

        def chunks() -> Iterator[pb.RegisterProblemsRequest]:
            buf: list[pb.Problem] = []
            try:
                for p in problems:
                    buf.append(p)
                    if len(buf) >= chunk_size:
                        yield pb.RegisterProblemsRequest(problems=buf, replace=replace)
                        buf = []
            except Exception as e:
                failed.append(e)
                raise  # gRPC cancels the stream: no partial batch is sent as if it were the whole
            if buf:
                yield pb.RegisterProblemsRequest(problems=buf, replace=replace)

        try:
            return self.stub.RegisterProblems(chunks(), timeout=None, metadata=self._metadata)
        except grpc.RpcError as e:
            if failed:  # the iterator's own error, not gRPC's "Exception iterating requests!"
                raise failed[0] from None
            raise map_rpc_error(e, "RegisterProblems", self.settings.max_message_mb) from None

    def sample(
        self,
        batch_size: int,
        worker_id: str = "",
        lease_timeout_s: float = 0.0,
        client_source: int = pb.CLIENT_SOURCE_UNSPECIFIED,
        request_id: str | None = None,
        accepts_group_size: bool = False,
    ) -> pb.SampleProblemsResponse:
        """Lease up to ``batch_size`` problems (see ``SampleProblems`` in the proto).

        ``client_source`` is a ``pb.ClientSource`` value: the kind of client, for the server's metrics.
        ``request_id``: sent unchanged on every retry of this call, so a retry after a lost answer
        gets the lease the first attempt made instead of a second one (default: a new random id
        per call). ``accepts_group_size``: this client generates ``LeasedProblem.group_size``
        completions where it is set (a server whose sampler probes refuses clients without it:
        FailedPrecondition).
        """
        req = pb.SampleProblemsRequest(
            batch_size=batch_size,
            worker_id=worker_id,
            lease_timeout_s=lease_timeout_s,
            client_source=client_source,  # type: ignore[arg-type]  # protobuf stubs type enum fields as the enum; the int value is valid
            accepts_group_size=accepts_group_size,
            request_id=uuid.uuid4().hex if request_id is None else request_id,
        )
        return self._call("SampleProblems", self.stub.SampleProblems, req)

    def report(
        self,
        lease_id: str,
        outcomes: Sequence[pb.ProblemOutcome],
        worker_id: str = "",
        client_source: int = pb.CLIENT_SOURCE_UNSPECIFIED,
        rewards_only: bool = False,
        more_parts: bool = False,
        unservable: Sequence[str] = (),
    ) -> pb.ReportOutcomesResponse:
        """Report a lease's groups. Retrying is safe: a repeated report changes nothing.

        ``rewards_only``: the caller trains on its own; statistics are updated, nothing is queued
        for the learner. ``more_parts``: this is one part of a report sent in several (too large
        for one message); the lease stays live for its problems not yet reported, each problem is
        applied at most once, and the last part leaves it False. ``unservable``: ids of leased
        problems the caller cannot serve (prompt longer than its model's context): quarantined
        until registered again.
        """
        req = pb.ReportOutcomesRequest(
            lease_id=lease_id,
            outcomes=outcomes,
            worker_id=worker_id,
            client_source=client_source,  # type: ignore[arg-type]  # protobuf stubs type enum fields as the enum; the int value is valid
            rewards_only=rewards_only,
            more_parts=more_parts,
            unservable_problem_ids=unservable,
        )
        return self._call("ReportOutcomes", self.stub.ReportOutcomes, req)

    def renew(
        self,
        lease_id: str,
        worker_id: str = "",
        lease_timeout_s: float = 0.0,
        client_source: int = pb.CLIENT_SOURCE_UNSPECIFIED,
    ) -> pb.RenewLeaseResponse:
        """Extend a live lease to now + ``lease_timeout_s`` seconds (0: the server's default); see
        ``RenewLease`` in the proto. Retrying is safe (a repeat sets the deadline again).

        Raises:
            InvalidArgument: empty lease id, or lease_timeout_s negative or over the server's
                --max-lease-timeout-s.
            NotFound: the lease is unknown, already reported or expired (its problems may be leased
                again: drop the batch).
            FailedPrecondition: the lease was sampled by another ``worker_id``.
        """
        req = pb.RenewLeaseRequest(
            lease_id=lease_id,
            worker_id=worker_id,
            lease_timeout_s=lease_timeout_s,
            client_source=client_source,  # type: ignore[arg-type]  # protobuf stubs type enum fields as the enum; the int value is valid
        )
        return self._call("RenewLease", self.stub.RenewLease, req)

    def report_lease(
        self,
        lease_id: str,
        outcomes: Sequence[pb.ProblemOutcome],
        worker_id: str = "",
        client_source: int = pb.CLIENT_SOURCE_UNSPECIFIED,
        rewards_only: bool = False,
        unservable: Sequence[str] = (),
        observe: Callable[[str, float], None] | None = None,
    ) -> pb.ReportOutcomesResponse:
        """Report a whole lease, in parts when one message would be too large (:meth:`report` per part).

        Parts are cut to fit this client's ``max_message_mb`` (less :data:`REPORT_MARGIN_BYTES`,
        :func:`split_outcomes`); a part the server refuses as too large (its own, lower limit) is
        halved and sent again. Every part but the last has ``more_parts`` set, so the lease stays
        live until the last one; ``unservable`` goes with the last. A single outcome too large for
        the server is left out (logged, naming ``--max-message-mb``); its problem returns
        unreported when the lease ends. Sending stops at the first part the server does not accept.

        Args:
            observe: ``observe("ReportOutcomes", seconds)`` after each part (a worker's RPC timer).

        Returns:
            One ``ReportOutcomesResponse`` summing the parts' counts; accepted when every part was,
            else the reason of the first refusal.

        Raises:
            PrioreplayError: a part could not be delivered (after retries); earlier parts stay applied.
        """
        limit = self.settings.max_message_mb * 1024 * 1024 - REPORT_MARGIN_BYTES
        parts = split_outcomes(outcomes, limit)

        def send(part: list[pb.ProblemOutcome], last: bool) -> pb.ReportOutcomesResponse:
            report = functools.partial(
                self.report,
                lease_id,
                part,
                worker_id=worker_id,
                client_source=client_source,
                rewards_only=rewards_only,
                more_parts=not last,
                unservable=unservable if last else (),
            )
            return report() if observe is None else timed_call(observe, "ReportOutcomes", report)

        total = _send_parts(lease_id, parts, send)
        if len(parts) > 1:
            log.info("lease %s reported in %d parts (over %.1f MiB in one)", lease_id, len(parts), limit / 2**20)
        return total

    def pull(
        self,
        max_groups: int,
        wait_s: float = 0.0,
        consumer: str = "learner",
        include_own_pending: bool = False,
        batch_groups: int = 0,
    ) -> pb.PullTrajectoriesResponse:
        """Pull up to ``max_groups`` trajectory groups, waiting up to ``wait_s`` seconds for one.

        ``batch_groups``: the learner's batch in groups, declared to a server with a pace bound
        (``PullTrajectoriesRequest.learner_batch_groups``; 0: not declared).
        """
        req = pb.PullTrajectoriesRequest(
            max_groups=max_groups,
            wait_s=wait_s,
            consumer=consumer,
            include_own_pending=include_own_pending,
            max_response_bytes=self.settings.max_message_mb * 1024 * 1024,
            learner_batch_groups=batch_groups,
        )
        return self._call("PullTrajectories", self.stub.PullTrajectories, req, timeout=self.settings.rpc_timeout_s + wait_s)

    def ack(self, group_ids: Sequence[str]) -> pb.AckTrajectoriesResponse:
        """Acknowledge groups after the optimizer step that used them (idempotent)."""
        return self._call("AckTrajectories", self.stub.AckTrajectories, pb.AckTrajectoriesRequest(group_ids=group_ids))

    def publish(self, version: int, weights_uri: str) -> pb.PublishPolicyResponse:
        """Publish policy ``version`` with weights at ``weights_uri`` (idempotent for the same pair)."""
        req = pb.PublishPolicyRequest(version=version, weights_uri=weights_uri)
        return self._call("PublishPolicy", self.stub.PublishPolicy, req)

    def stats(self, histogram_buckets: int = 10) -> pb.GetStatsResponse:
        """Pool sizes, the priority histogram and counters."""
        return self._call("GetStats", self.stub.GetStats, pb.GetStatsRequest(histogram_buckets=histogram_buckets))
