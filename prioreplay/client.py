"""A synchronous client of the priority server, used by workers, the learner and the CLI.

It sets explicit message-size limits, sends the bearer token as call credentials (over TLS) or
as metadata (plaintext, local use), retries UNAVAILABLE / DEADLINE_EXCEEDED with exponential
backoff and jitter, and maps status codes back to :mod:`prioreplay.errors`.
"""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

import grpc

from prioreplay.config import ClientSettings
from prioreplay.errors import ERRORS_BY_CODE, PrioreplayError, StoreUnavailable
from prioreplay.problems import ProblemRecord
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def channel_options(max_message_mb: int) -> list[tuple[str, int]]:
    """gRPC channel/server options with explicit send/receive limits (MiB → bytes)."""
    n = max_message_mb * 1024 * 1024
    return [("grpc.max_send_message_length", n), ("grpc.max_receive_message_length", n)]


#: Target schemes whose addresses the client spreads RPCs over (gRPC's round_robin policy).
BALANCED_SCHEMES = ("dns:", "ipv4:", "ipv6:")
_ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})


def client_channel_options(target: str, max_message_mb: int) -> list[tuple[str, int | str]]:
    """Channel options of a client of ``target``: the message limits, and for a target with a
    resolver scheme (``dns:///priority-server:50051``, ``ipv4:10.0.0.1:50051,10.0.0.2:50051``)
    gRPC's ``round_robin`` policy, which keeps a connection to every address the name resolves to
    (e.g. each replica of ``docker compose --scale priority-server=N``) and spreads RPCs over them.
    A plain ``HOST:PORT`` keeps gRPC's default (one connection to the first address that answers).
    """
    opts: list[tuple[str, int | str]] = list(channel_options(max_message_mb))
    if target.startswith(BALANCED_SCHEMES):
        opts.append(("grpc.service_config", _ROUND_ROBIN))
    return opts


def problem_to_proto(problem: ProblemRecord) -> pb.Problem:
    """The proto ``Problem`` of a :class:`~prioreplay.problems.ProblemRecord` (loaders, the servicer)."""
    return pb.Problem(id=problem.id, prompt=problem.prompt, answer=problem.answer, verifier=problem.verifier,
                      metadata=dict(problem.metadata))


def timed_call(observe: Callable[[str, float], None], method: str, fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)``, then ``observe(method, seconds)`` with its wall time, also when it raises.

    The worker and the learner time their RPCs with it (retries and backoff included).
    """
    t0 = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    finally:
        observe(method, time.perf_counter() - t0)


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
        details += (f" (a gRPC message limit: --max-message-mb, {mine}; the server has its own --max-message-mb. "
                    "Raise the limit of the side that refused, or send less per call)")
    return cls(f"{method}: {details}")


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

    def __init__(self, settings: ClientSettings | None = None, *, max_retries: int = 8, backoff_s: float = 0.2,
                 sleep: Callable[[float], None] = time.sleep):
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
                    log.warning("%s: %s (%s); retry %d/%d in %.2fs", method, e.code().name, e.details(),
                                attempt + 1, self.max_retries, wait)
                    self._sleep(wait)
                    delay *= 2
                    continue
                raise map_rpc_error(e, method, self.settings.max_message_mb) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "PriorityClient":
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
    def register(self, problems: Iterable[pb.Problem], chunk_size: int = 512,
                 replace: bool = False) -> pb.RegisterProblemsResponse:
        """Stream problems in chunks of ``chunk_size``. Not retried (a stream is not replayable).

        ``replace``: a registered id with another prompt or answer takes the new text (statistics
        kept); without it such an id refuses its chunk.

        Raises:
            InvalidArgument: a malformed problem, or (without ``replace``) ids registered with
                another prompt or answer (the message names them, ``--id-prefix`` and ``--replace``).
            StoreUnavailable: the server or its store cannot be reached.
        """

        def chunks() -> Iterator[pb.RegisterProblemsRequest]:
            buf: list[pb.Problem] = []
            for p in problems:
                buf.append(p)
                if len(buf) >= chunk_size:
                    yield pb.RegisterProblemsRequest(problems=buf, replace=replace)
                    buf = []
            if buf:
                yield pb.RegisterProblemsRequest(problems=buf, replace=replace)

        try:
            return self.stub.RegisterProblems(chunks(), timeout=None, metadata=self._metadata)
        except grpc.RpcError as e:
            raise map_rpc_error(e, "RegisterProblems", self.settings.max_message_mb) from None

    def sample(self, batch_size: int, worker_id: str = "", lease_timeout_s: float = 0.0,
               client_source: int = pb.CLIENT_SOURCE_UNSPECIFIED, request_id: str | None = None,
               accepts_group_size: bool = False) -> pb.SampleProblemsResponse:
        """Lease up to ``batch_size`` problems (see ``SampleProblems`` in the proto).

        ``client_source`` is a ``pb.ClientSource`` value: the kind of client, for the server's metrics.
        ``request_id``: sent unchanged on every retry of this call, so a retry after a lost answer
        gets the lease the first attempt made instead of a second one (default: a new random id
        per call). ``accepts_group_size``: this client generates ``LeasedProblem.group_size``
        completions where it is set (a server whose sampler probes refuses clients without it:
        FailedPrecondition).
        """
        req = pb.SampleProblemsRequest(batch_size=batch_size, worker_id=worker_id, lease_timeout_s=lease_timeout_s,
                                       client_source=client_source, accepts_group_size=accepts_group_size,
                                       request_id=uuid.uuid4().hex if request_id is None else request_id)
        return self._call("SampleProblems", self.stub.SampleProblems, req)

    def report(self, lease_id: str, outcomes: Sequence[pb.ProblemOutcome], worker_id: str = "",
               client_source: int = pb.CLIENT_SOURCE_UNSPECIFIED, rewards_only: bool = False,
               more_parts: bool = False, unservable: Sequence[str] = ()) -> pb.ReportOutcomesResponse:
        """Report a lease's groups. Retrying is safe: a repeated report changes nothing.

        ``rewards_only``: the caller trains on its own; statistics are updated, nothing is queued
        for the learner. ``more_parts``: this is one part of a report sent in several (too large
        for one message); the lease stays live for its problems not yet reported, each problem is
        applied at most once, and the last part leaves it False. ``unservable``: ids of leased
        problems the caller cannot serve (prompt longer than its model's context): quarantined
        until registered again.
        """
        req = pb.ReportOutcomesRequest(lease_id=lease_id, outcomes=outcomes, worker_id=worker_id,
                                       client_source=client_source, rewards_only=rewards_only,
                                       more_parts=more_parts, unservable_problem_ids=unservable)
        return self._call("ReportOutcomes", self.stub.ReportOutcomes, req)

    def pull(self, max_groups: int, wait_s: float = 0.0, consumer: str = "learner",
             include_own_pending: bool = False) -> pb.PullTrajectoriesResponse:
        """Pull up to ``max_groups`` trajectory groups, waiting up to ``wait_s`` seconds for one."""
        req = pb.PullTrajectoriesRequest(max_groups=max_groups, wait_s=wait_s, consumer=consumer,
                                         include_own_pending=include_own_pending,
                                         max_response_bytes=self.settings.max_message_mb * 1024 * 1024)
        return self._call("PullTrajectories", self.stub.PullTrajectories, req,
                          timeout=self.settings.rpc_timeout_s + wait_s)

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
