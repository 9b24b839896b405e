"""Waiting on an empty trajectory queue is never an error, against the real Redis.

A learner's PullTrajectories waits ``pull_wait_s`` (5 s by default) in ``XREAD BLOCK``. On one
client whose reply time-out (redis-py's ``socket_timeout``, 5 s by default) is no longer than the
block, the wait ended in ``TimeoutError``: UNAVAILABLE "Redis is unreachable", a count of
``prioreplay_store_errors_total{kind="unreachable"}`` and a firing PrioreplayStoreErrors alert on
an idle stack (issue 44). The blocking read now goes through a client whose time-out exceeds its
block (services/priority_server/store/redis/connection.py). Each test here waits longer than that
5 s on an empty queue and sees no error.
"""

from __future__ import annotations

import time

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.store.redis.connection import SOCKET_TIMEOUT_S, RedisConnection
from tests.conftest import start_background_server

#: Longer than the reply time-out of every other command: the wait that used to end in TimeoutError.
WAIT_S = SOCKET_TIMEOUT_S + 1.5


async def test_a_pull_waiting_past_the_reply_timeout_on_an_empty_queue_returns_nothing(redis_store_factory):
    store = redis_store_factory()
    started = time.monotonic()
    assert await store.pull("learner", 4, wait_s=WAIT_S) == []  # raised StoreUnavailable (unreachable) before
    assert time.monotonic() - started >= WAIT_S - 0.1  # it waited, rather than returning early


def test_the_blocking_client_outwaits_its_longest_block(redis_url):
    connection = RedisConnection(redis_url)
    blocking_timeout = connection.blocking.connection_pool.connection_kwargs["socket_timeout"]
    assert connection.client.connection_pool.connection_kwargs["socket_timeout"] == SOCKET_TIMEOUT_S
    assert blocking_timeout >= connection.max_block_s + SOCKET_TIMEOUT_S
    assert connection.max_block_s >= 60.0  # PullTrajectories' longest wait_s is one block
    # A URL's own socket_timeout wins in redis-py: the block then shrinks below it.
    short = RedisConnection(redis_url + "?socket_timeout=3")
    assert 0 < short.max_block_s < 3.0


def test_an_idle_learner_pull_counts_no_store_error(redis_url, namespace):
    """Through the server: a PullTrajectories that waits past 5 s answers OK with no groups, and
    the server counts no store error and logs nothing (``prioreplay_store_errors_total`` stays 0)."""
    server = start_background_server("redis", redis_url, namespace, ServerConfig())
    try:
        with PriorityClient(ClientSettings(server=server.address), max_retries=0) as client:
            started = time.monotonic()
            assert list(client.pull(max_groups=4, wait_s=WAIT_S).groups) == []
            assert time.monotonic() - started >= WAIT_S - 0.1
        text = server.runtime.metrics.render().decode()
        errors = [line for line in text.splitlines() if line.startswith("prioreplay_store_errors_total{")]
        assert errors and all(line.endswith(" 0.0") for line in errors), errors
    finally:
        server.stop()
