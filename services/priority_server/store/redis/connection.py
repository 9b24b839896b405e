"""Connecting to Redis: a plain URL, or a primary found through Redis Sentinel.

Two forms of ``--store`` reach Redis:

* ``redis://[[user]:password@]host[:port][/db]`` (``rediss://`` for TLS, ``unix://`` for a socket):
  one Redis, through redis-py's ``Redis.from_url``.
* ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]``
  (``rediss+sentinel://`` for TLS to the primary): the sentinels to ask, the name of the
  monitored primary (``sentinel monitor <service_name> ...``) and the database (default 0). The
  user and password are the primary's; sentinels that need a password of their own get it from
  the query parameter ``sentinel_password`` (and ``sentinel_username``). The client is redis-py's
  :class:`redis.asyncio.sentinel.Sentinel` with ``master_for(service_name)``: each new connection
  asks the sentinels for the current primary, and a connection to a demoted primary (answering
  READONLY) is dropped, so after a failover the store follows the promoted replica without a
  restart. Meanwhile every call fails with a connection error (no primary known: redis-py's
  ``MasterNotFoundError``), which the store maps to UNAVAILABLE (kind ``unreachable``).

Blocking reads (``XREAD BLOCK``, a pull waiting on an empty trajectory queue) go through
:attr:`RedisConnection.blocking`, a second client whose reply time-out (redis-py's
``socket_timeout``) exceeds the longest block (:attr:`RedisConnection.max_block_s`) by
:data:`SOCKET_TIMEOUT_S`: waiting on an empty queue is never a time-out, so never "unreachable".
Every other command keeps the short reply time-out of :attr:`RedisConnection.client`.

The password never leaves this module unredacted: errors quote the URL through
:func:`prioreplay.redact.redact_url`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel

from prioreplay.errors import InvalidArgument
from prioreplay.redact import redact_url

#: URL schemes of a primary found through Sentinel.
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
#: Seconds to wait for a TCP connection to Redis or to a sentinel.
CONNECT_TIMEOUT_S = 5.0
#: Seconds to wait for the reply to a command (redis-py's ``socket_timeout``): a Redis that holds the
#: connection but does not answer is unreachable after this long. Set here rather than left to
#: redis-py's default (5 s in redis-py 8), so that the blocking client's time-out is known to exceed it.
SOCKET_TIMEOUT_S = 5.0
#: The longest ``BLOCK`` of one blocking read, seconds (PullTrajectories' longest ``wait_s``); a
#: longer wait is several reads. The blocking client waits this plus SOCKET_TIMEOUT_S for a reply.
MAX_BLOCK_S = 60.0
#: Seconds a sentinel has to answer a query (it answers from memory: a stuck one is skipped).
SENTINEL_TIMEOUT_S = 1.0
SENTINEL_URL_FORM = "redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]"


@dataclass(frozen=True)
class SentinelTarget:
    """A parsed ``redis+sentinel://`` URL (see the module docstring)."""

    sentinels: tuple[tuple[str, int], ...]
    service_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    ssl: bool = False


def is_sentinel_url(url: str) -> bool:
    """True when ``url`` names a primary through Sentinel (``redis+sentinel://``)."""
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES and "://" in url


def _bad(url: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"redis url {redact_url(url)!r} is invalid ({why}); use {SENTINEL_URL_FORM}")


def _host_port(url: str, item: str) -> tuple[str, int]:
    host, sep, port = item.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _bad(url, f"sentinel address {item!r} is not host:port")
    return host.strip("[]"), int(port)


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Parse ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]``.

    Query parameters: ``sentinel_password``, ``sentinel_username`` (the sentinels' own
    credentials; none by default).

    Raises:
        InvalidArgument: no sentinel address, an address that is not ``host:port``, no service
            name, a db that is not an integer >= 0, or an unknown query parameter (the message
            quotes the URL with its passwords hidden and gives the form).
    """
    try:
        parts = urlsplit(url)
    except ValueError as e:  # e.g. an unbalanced [ of an IPv6 address
        raise _bad(url, str(e)) from None
    userinfo, _, hosts = parts.netloc.rpartition("@")
    if not hosts:
        raise _bad(url, "no sentinel address")
    sentinels = tuple(_host_port(url, h) for h in hosts.split(","))
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise _bad(url, "the path must be /service_name or /service_name/db")
    if len(path) == 2 and not path[1].isdigit():
        raise _bad(url, f"db ({path[1]!r}) must be an integer >= 0")
    user, has_password, password = userinfo.partition(":")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(query) - {"sentinel_password", "sentinel_username"})
    if unknown:
        raise _bad(url, f"unknown query parameter {unknown[0]!r}; only sentinel_password, sentinel_username")
    return SentinelTarget(
        sentinels=sentinels,
        service_name=unquote(path[0]),
        db=int(path[1]) if len(path) == 2 else 0,
        username=unquote(user) or None,
        password=unquote(password) if has_password else None,
        sentinel_username=query.get("sentinel_username") or None,
        sentinel_password=query.get("sentinel_password") or None,
        ssl=parts.scheme.lower().startswith("rediss"),
    )


class RedisConnection:
    """The redis-py client of a store URL, and whatever else must be closed with it.

    :attr:`client` answers every command within :data:`SOCKET_TIMEOUT_S`; :attr:`blocking` (its own
    pool, same URL) is for blocking reads of up to :attr:`max_block_s` seconds.

    Args:
        url: a ``redis://``, ``rediss://``, ``unix://`` or ``redis+sentinel://`` URL.

    Raises:
        InvalidArgument: a malformed URL (password hidden in the message).
    """

    def __init__(self, url: str):
        self.sentinel: Sentinel | None = None
        #: The monitored primary's name behind Sentinel (``sentinel monitor <name>``); None for a plain URL.
        self.service_name: str | None = None
        common: dict[str, Any] = dict(
            decode_responses=False, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=SOCKET_TIMEOUT_S
        )
        blocking = dict(common, socket_timeout=MAX_BLOCK_S + SOCKET_TIMEOUT_S)
        if is_sentinel_url(url):
            t = parse_sentinel_url(url)
            self.service_name = t.service_name
            self.sentinel = Sentinel(
                list(t.sentinels),
                sentinel_kwargs=dict(
                    socket_connect_timeout=SENTINEL_TIMEOUT_S,
                    socket_timeout=SENTINEL_TIMEOUT_S,
                    username=t.sentinel_username,
                    password=t.sentinel_password,
                ),
            )
            primary: dict[str, Any] = dict(db=t.db, username=t.username, password=t.password, ssl=t.ssl)
            self.client: aioredis.Redis = self.sentinel.master_for(t.service_name, **primary, **common)
            self.blocking: aioredis.Redis = self.sentinel.master_for(t.service_name, **primary, **blocking)
            return
        try:
            self.client = aioredis.Redis.from_url(url, **common)
            self.blocking = aioredis.Redis.from_url(url, **blocking)
        except ValueError as e:
            raise InvalidArgument(
                f"redis url {redact_url(url)!r} is invalid ({e}); use redis://[:password@]host:port/db or {SENTINEL_URL_FORM}"
            ) from None

    @property
    def max_block_s(self) -> float:
        """The longest ``BLOCK`` of one read on :attr:`blocking`, seconds: :data:`MAX_BLOCK_S`, or less
        when the URL set a shorter ``socket_timeout`` (its query parameter wins over ours): then
        half of that, so the block still ends well before the reply time-out."""
        timeout = self.blocking.connection_pool.connection_kwargs.get("socket_timeout")
        if timeout is None:
            return MAX_BLOCK_S
        return min(MAX_BLOCK_S, float(timeout) - min(SOCKET_TIMEOUT_S, float(timeout) / 2))

    async def reset_sentinels(self) -> None:
        """Drop every pooled connection to the sentinels, so the next discovery opens new ones.

        Called when no sentinel named a primary (``MasterNotFoundError``): redis-py then asked each
        sentinel and every answer was an error or a primary marked down. A CI run saw that go on for
        30 s after ``+switch-master`` while a fresh client named the promoted replica at once, so a
        pooled sentinel connection in a bad state is not given the chance to keep a failover
        unseen. A plain URL has no sentinels: nothing to do.
        """
        if self.sentinel is None:
            return
        for client in self.sentinel.sentinels:
            await client.connection_pool.disconnect()

    async def aclose(self) -> None:
        """Close both clients' pools and the connections to the sentinels."""
        await self.client.aclose()
        await self.blocking.aclose()
        if self.sentinel is not None:
            await self.sentinel.aclose()
