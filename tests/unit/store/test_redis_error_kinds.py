"""Every Redis error kind maps to one store error kind (store.redis.errors.error_kind), no Redis needed:
the errors are constructed, not provoked (tests/system/faults/test_redis_error_status.py provokes them on a
real Redis and checks the status codes and health that follow).
"""

from __future__ import annotations

import pytest
import redis


@pytest.mark.parametrize(
    "error,kind",
    [
        (redis.exceptions.ConnectionError("Error 111 connecting"), "unreachable"),
        (redis.exceptions.TimeoutError("Timeout reading from socket"), "unreachable"),
        (redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"), "unreachable"),
        (ConnectionResetError("reset by peer"), "unreachable"),
        (redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'"), "out_of_memory"),
        (redis.exceptions.ReadOnlyError("You can't write against a read only replica."), "read_only"),
        (redis.exceptions.MasterDownError("Link with MASTER is down"), "read_only"),
        (redis.exceptions.ResponseError("NOREPLICAS Not enough good replicas to write."), "read_only"),
        (redis.exceptions.ResponseError("BUSY Redis is busy running a script."), "busy"),
        (redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"), "busy"),
        (
            redis.exceptions.ResponseError("Error running script (call to f_x): @user_script:1: OOM command not allowed"),
            "out_of_memory",
        ),  # Redis 6 wraps a script's error
        (redis.exceptions.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), "logic"),
        (redis.exceptions.NoPermissionError("this user has no permissions to run the 'evalsha' command"), "logic"),
    ],
)
def test_every_redis_error_kind_has_one_mapping(error, kind):
    from prioreplay.priority_server.store.redis.errors import ERROR_KINDS, error_kind

    assert error_kind(error) == kind and kind in ERROR_KINDS
