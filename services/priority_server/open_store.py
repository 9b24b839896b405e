"""The store factory: ``memory`` or a Redis URL → a :class:`~prioreplay.priority_server.store.Store`.

The Redis store (and so redis-py) is imported only when a Redis URL is given, so the in-process
store and ``prioreplay --help`` stay light.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from prioreplay.errors import InvalidArgument
from prioreplay.redact import redact_url

from .config import ReplicationSettings
from .store import Store, StoreConfig

REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")


def create_store(
    spec: str,
    config: StoreConfig,
    *,
    namespace: str = "default",
    snapshot_path: Path | None = None,
    clock: Callable[[], float] | None = None,
    replication: ReplicationSettings | None = None,
) -> Store:
    """Build the store named by ``spec``.

    Args:
        spec: ``"memory"`` (the in-process store) or a Redis URL ``redis://[[user]:password@]host[:port][/db]``
            (``rediss://`` for TLS, ``unix://`` for a socket), or
            ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]``: the
            primary Redis Sentinel names, followed through failovers (:mod:`.store.redis.connection`).
        config: sampling and bookkeeping parameters shared by both stores.
        namespace: the run's key prefix / hash tag in Redis (ignored by ``memory``).
        snapshot_path: JSON file the ``memory`` store restores from and snapshots to (ignored by
            ``redis``, which persists by itself); None: no snapshot.
        clock: returns unix seconds, injected for deterministic tests; None: the memory store reads
            ``time.time``, the Redis store Redis's own clock (``TIME`` in its scripts: one clock for
            every replica). Servers never inject one.
        replication: replica acknowledgements each change of the Redis store waits for (Redis
            ``WAIT``; default ``all``: every replica a failover could promote); the memory store,
            which has none, refuses a number above 0.

    Raises:
        InvalidArgument: ``spec`` is neither form (the message names it, password hidden), or the
            memory snapshot is corrupt.
    """
    if spec == "memory":
        if replication is not None and replication.fixed_acks:
            raise InvalidArgument(
                f"min_replica_acks ({replication.min_replica_acks}) needs a Redis store with "
                "replicas; use a Redis URL or --min-replica-acks 0"
            )
        from .store.memory_store import MemoryStore

        return MemoryStore(config, snapshot_path, clock=clock or time.time)
    scheme = spec.partition("://")[0].lower() if "://" in spec else ""
    if scheme in REDIS_SCHEMES:
        from .store.redis import RedisStore

        return RedisStore(config, spec, namespace, clock=clock, replication=replication)
    raise InvalidArgument(
        f"store ({redact_url(spec)!r}) must be 'memory' (in-process, snapshots to a file) or a Redis URL "
        "'redis://HOST:PORT/DB' ('rediss://...' for TLS, "
        "'redis+sentinel://HOST:PORT[,HOST:PORT]/SERVICE[/DB]' through Sentinel)"
    )
