"""Domain errors shared by the stores, the servicer and the client.

The servicer maps each class to one gRPC status code (``GRPC_CODE``); the client maps the code
back to the same class, so callers handle one set of exceptions whether the store is in-process
or behind gRPC.
"""

from __future__ import annotations


class PrioreplayError(Exception):
    """Base class of every error this project raises on purpose."""

    GRPC_CODE = "UNKNOWN"


class InvalidArgument(PrioreplayError, ValueError):
    """A request field is missing, out of range, NaN/inf or inconsistent. Nothing changed."""

    GRPC_CODE = "INVALID_ARGUMENT"


class NotFound(PrioreplayError, KeyError):
    """A named problem (or other entity) does not exist."""

    GRPC_CODE = "NOT_FOUND"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class FailedPrecondition(PrioreplayError):
    """The request conflicts with the current state (e.g. publishing an older policy)."""

    GRPC_CODE = "FAILED_PRECONDITION"


class ResourceExhausted(PrioreplayError):
    """A message or batch exceeds a configured limit."""

    GRPC_CODE = "RESOURCE_EXHAUSTED"


class Unauthenticated(PrioreplayError):
    """The bearer token is missing or wrong."""

    GRPC_CODE = "UNAUTHENTICATED"


#: The bounded ``kind`` label of ``prioreplay_store_errors_total``: the reasons of
#: :class:`StoreUnavailable` and ``logic`` (:class:`Internal`).
STORE_ERROR_KINDS = ("unreachable", "read_only", "out_of_memory", "busy", "evicting", "logic")


class StoreUnavailable(PrioreplayError):
    """The backing store (Redis) cannot serve writes now; the caller should retry with backoff.

    ``kind`` says why (a bounded label, ``prioreplay_store_errors_total{kind}``): ``unreachable``
    (connection refused, reset or timed out; Redis loading its data), ``read_only`` (a replica,
    or a primary that lost its replicas under ``min-replicas-to-write``), ``out_of_memory`` (over
    ``maxmemory``), ``busy`` (a script or a cluster failover in progress), ``evicting`` (a Redis whose
    ``maxmemory-policy`` deletes keys when memory is full: nothing is served from it). The server answers
    UNAVAILABLE and reports health NOT_SERVING until the store accepts writes again.
    """

    GRPC_CODE = "UNAVAILABLE"

    def __init__(self, message: str = "", kind: str = "unreachable"):
        super().__init__(message)
        self.kind = kind


class Internal(PrioreplayError):
    """The server met an answer it cannot use (a bug, or a store key changed by someone else).

    Retrying does not help; the server logged the cause (one line naming the store's error).
    """

    GRPC_CODE = "INTERNAL"


ERRORS_BY_CODE: dict[str, type[PrioreplayError]] = {
    cls.GRPC_CODE: cls
    for cls in (InvalidArgument, NotFound, FailedPrecondition, ResourceExhausted, Unauthenticated, StoreUnavailable, Internal)
}
