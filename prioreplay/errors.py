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


class StoreUnavailable(PrioreplayError):
    """The backing store (Redis) cannot be reached; the caller should retry with backoff."""

    GRPC_CODE = "UNAVAILABLE"


ERRORS_BY_CODE: dict[str, type[PrioreplayError]] = {
    cls.GRPC_CODE: cls
    for cls in (InvalidArgument, NotFound, FailedPrecondition, ResourceExhausted, Unauthenticated, StoreUnavailable)
}
