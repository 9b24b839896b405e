"""The ``redis+sentinel://`` store URL: parsed into sentinels, service, db and credentials; refused
with the form and the password hidden; accepted by the server's settings; ``--min-replica-acks``
refused with the memory store."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prioreplay.errors import InvalidArgument
from prioreplay.priority_server.config import ReplicationSettings, ServerConfig
from prioreplay.priority_server.open_store import create_store
from prioreplay.priority_server.store import StoreConfig
from prioreplay.priority_server.store.redis.connection import SentinelTarget, is_sentinel_url, parse_sentinel_url
from prioreplay.redact import redact_url


@pytest.mark.parametrize(
    "url, target",
    [
        ("redis+sentinel://127.0.0.1:26379/prio", SentinelTarget(sentinels=(("127.0.0.1", 26379),), service_name="prio")),
        (
            "redis+sentinel://app:s3cret@s1:26379,s2:26380,[::1]:26381/prio/3?sentinel_password=sp",
            SentinelTarget(
                sentinels=(("s1", 26379), ("s2", 26380), ("::1", 26381)),
                service_name="prio",
                db=3,
                username="app",
                password="s3cret",
                sentinel_password="sp",
            ),
        ),
        (
            "rediss+sentinel://:pw@s1:26379/prio/0",
            SentinelTarget(sentinels=(("s1", 26379),), service_name="prio", password="pw", ssl=True),
        ),
    ],
)
def test_a_sentinel_url_names_its_sentinels_service_db_and_credentials(url, target):
    assert is_sentinel_url(url) and parse_sentinel_url(url) == target


@pytest.mark.parametrize(
    "url, why",
    [
        ("redis+sentinel://:s3cret@/prio", "no sentinel address"),
        ("redis+sentinel://:s3cret@s1/prio", "sentinel address 's1' is not host:port"),
        ("redis+sentinel://:s3cret@s1:26379", "the path must be /service_name"),
        ("redis+sentinel://:s3cret@s1:26379/prio/x", "db ('x') must be an integer"),
        ("redis+sentinel://:s3cret@s1:26379/prio?timeout=1", "unknown query parameter 'timeout'"),
    ],
)
def test_a_malformed_sentinel_url_is_refused_with_the_form_and_no_password(url, why):
    with pytest.raises(InvalidArgument) as err:
        parse_sentinel_url(url)
    msg = str(err.value)
    assert why in msg and "redis+sentinel://[[user]:password@]host:port" in msg and "s3cret" not in msg


def test_sentinel_passwords_are_redacted():
    assert (
        redact_url("redis+sentinel://:a@s1:1,s2:2/prio?sentinel_password=b")
        == "redis+sentinel://:***@s1:1,s2:2/prio?sentinel_password=***"
    )


def test_the_server_takes_a_sentinel_store_and_refuses_replica_acks_without_redis():
    assert ServerConfig(store="redis+sentinel://s1:26379/prio/0", min_replica_acks=1).replication() == ReplicationSettings(
        min_replica_acks=1
    )
    with pytest.raises(ValidationError, match="min_replica_acks \\(1\\) needs a Redis store"):
        ServerConfig(store="memory", min_replica_acks=1)
    with pytest.raises(InvalidArgument, match="min_replica_acks \\(2\\) needs a Redis store"):
        create_store("memory", StoreConfig(), replication=ReplicationSettings(min_replica_acks=2))


def test_no_primary_names_what_the_sentinels_answered_and_drops_their_connections():
    """A CI run's server kept answering "no sentinel names a primary" for 30 s after the promotion
    while a fresh client found it: the store now drops the sentinels' pooled connections on that
    error (at most once a second) and its message names the sentinels' errors."""
    import asyncio

    from redis.asyncio.sentinel import MasterNotFoundError

    store = create_store("redis+sentinel://127.0.0.1:1/prio/0", StoreConfig())
    resets: list[int] = []

    async def reset() -> None:
        resets.append(1)

    store._connection.reset_sentinels = reset  # type: ignore[attr-defined]
    error = MasterNotFoundError(
        "No master found for 'prio' : <redis.asyncio.client.Redis(<...(host=127.0.0.1,port=1,db=0)>)> - "
        "TimeoutError('Timeout reading from 127.0.0.1:1')"
    )

    async def failing():
        raise error

    async def twice():
        for _ in range(2):
            with pytest.raises(Exception) as caught:
                await store._do(failing())
        return caught.value

    raised = asyncio.run(twice())
    assert resets == [1]  # the second error came within the second: one reset
    assert "no sentinel names a primary" in str(raised) and "the sentinels' errors: TimeoutError" in str(raised)
    assert "port=1" not in str(raised)  # redis-py's client settings are left out
