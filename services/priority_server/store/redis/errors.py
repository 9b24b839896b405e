"""The Redis store's error taxonomy: each Redis (or socket) error is one kind of :data:`ERROR_KINDS`,
turned into our error by :func:`store_error` (StoreUnavailable for an outage, Internal for the rest)."""

from __future__ import annotations

from redis import exceptions as redis_errors
from redis.asyncio.sentinel import MasterNotFoundError

from prioreplay.errors import Internal, PrioreplayError, StoreUnavailable

#: How each Redis error maps to ours (``error_kind``): every kind but ``logic`` is an outage the
#: store may recover from (UNAVAILABLE, health NOT_SERVING, clients back off and retry); ``logic``
#: is an answer the server cannot use (INTERNAL, logged).
ERROR_KINDS = {
    "unreachable": "connection refused/reset/timed out, AUTH failed, Redis LOADING its data set",
    "read_only": "READONLY: a replica, or MASTERDOWN / min-replicas-to-write unmet, or WAIT counted fewer replicas "
    "than --min-replica-acks",
    "out_of_memory": "OOM: used memory over maxmemory (with maxmemory-policy noeviction)",
    "busy": "BUSY (a script over lua-time-limit), TRYAGAIN / CLUSTERDOWN (a failover)",
    "evicting": "maxmemory-policy other than noeviction, found by the health check: Redis may delete the run's keys "
    "(nothing is served until it is noeviction again)",
    "logic": "any other error answer (WRONGTYPE, a script error, NOPERM): a bug or a foreign key",
}
#: What an operator does about each outage kind (in the error message).
ERROR_FIX = {
    "read_only": "point --store at the primary (or promote this replica: REPLICAOF NO ONE)",
    "out_of_memory": "raise maxmemory or free memory (acknowledge trajectory groups, trim other data)",
    "busy": "wait for the running script or failover to finish",
    "evicting": "run CONFIG SET maxmemory-policy noeviction (and set it in redis.conf)",
}


def eviction_error(policy: str, redacted_url: str) -> str:
    """Why a Redis with ``maxmemory-policy`` ``policy`` (not ``noeviction``) is not served, and the fix."""
    return (
        f"Redis at {redacted_url} has maxmemory-policy {policy!r}: when its memory is full it deletes keys, and a run's "
        "statistics, pools, leases and queued groups are keys, so they would vanish without an error. Run "
        "`CONFIG SET maxmemory-policy noeviction` on it (and set it in redis.conf, so that a restart keeps it); with "
        "noeviction a full Redis refuses writes instead (UNAVAILABLE, retried) and loses nothing"
    )


def error_kind(e: BaseException) -> str:
    """The kind (a key of :data:`ERROR_KINDS`) of an exception from redis-py or the socket."""
    if isinstance(e, (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)):
        return "unreachable"  # includes BusyLoadingError, AuthenticationError, MaxConnectionsError
    if isinstance(e, redis_errors.OutOfMemoryError):
        return "out_of_memory"
    if isinstance(e, (redis_errors.ReadOnlyError, redis_errors.MasterDownError)):
        return "read_only"
    if isinstance(e, (redis_errors.TryAgainError, redis_errors.ClusterDownError)):
        return "busy"
    text = str(e)
    # inside a script the prefix may follow the script's own error text; match the code words
    for code, kind in (
        ("OOM ", "out_of_memory"),
        ("READONLY ", "read_only"),
        ("MASTERDOWN ", "read_only"),
        ("NOREPLICAS ", "read_only"),
        ("BUSY ", "busy"),
        ("LOADING ", "unreachable"),
    ):
        if text.startswith(code) or f" {code}" in text:
            return kind
    return "logic"


def sentinel_errors(message: str) -> str:
    """``; sentinels answered: ConnectionError, ...`` from a ``MasterNotFoundError`` message (redis-py
    appends ``: <client> - <error repr>, ...`` for each sentinel that failed; the clients' settings
    are left out), or "" when every sentinel answered."""
    _, sep, rest = message.partition(" : ")
    if not sep:
        return ""
    kinds = [part.split(" - ", 1)[1].split("(", 1)[0] for part in rest.split(", ") if " - " in part]
    return f"; the sentinels' errors: {', '.join(kinds)}" if kinds else ""


def unavailable_error(e: BaseException, redacted_url: str) -> StoreUnavailable:
    """StoreUnavailable for Redis at ``redacted_url`` that cannot be reached (``e``: the cause)."""
    if isinstance(e, MasterNotFoundError):  # redis-py's message repeats every sentinel client's settings
        asked = sentinel_errors(str(e))
        return StoreUnavailable(
            f"Redis at {redacted_url} is unreachable: no sentinel names a primary that is up (a failover "
            f"in progress, or no sentinel answers{asked}); wait for the promotion or check the sentinels, then retry"
        )
    return StoreUnavailable(
        f"Redis at {redacted_url} is unreachable ({type(e).__name__}: {e}); "
        "check that Redis runs and the URL is right, then retry"
    )


def store_error(e: BaseException, redacted_url: str) -> PrioreplayError:
    """Our error for a Redis error ``e`` of Redis at ``redacted_url`` (see :data:`ERROR_KINDS`): StoreUnavailable
    with the kind and the fix for an outage, Internal for a ``logic`` answer."""
    kind = error_kind(e)
    if kind == "unreachable":
        return unavailable_error(e, redacted_url)
    if kind == "logic":
        return Internal(f"Redis at {redacted_url} answered {type(e).__name__}: {e}")
    return StoreUnavailable(
        f"Redis at {redacted_url} is {kind.replace('_', ' ')} ({e}); {ERROR_FIX[kind]}, then retry", kind=kind
    )
