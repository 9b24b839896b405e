"""What runs beside a priority server: health status, the lease reaper, the /metrics refresh,
memory-store snapshots, and bounded shutdown steps.

The background tasks (lease reaper, memory-store snapshots, the refresh of ``/metrics`` and of
the health status from ``Store.stats()`` / ``Store.healthy()``) live as long as the server and end
when it stops (:func:`.server.stop_server`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from prioreplay.errors import StoreUnavailable

from .config import ServerConfig
from .metrics import ServerMetrics
from .servicer import SERVICE_NAME
from .store import EXPIRE_LIMIT, Store
from .store.pace import pace_limit

log = logging.getLogger(__name__)


@dataclass
class ServerRuntime:
    """What lives beside a running server: its store, metrics, health servicer and tasks."""

    store: Store
    config: ServerConfig
    metrics: ServerMetrics
    health: health_aio.HealthServicer
    port: int
    tasks: list[asyncio.Task] = field(default_factory=list)
    _outage_task: asyncio.Future | None = None
    _losses_counted: int = 0

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", SERVICE_NAME):
            await self.health.set(service, status)

    async def refresh(self) -> None:
        """Poll ``Store.healthy()`` and ``Store.stats()``; update health status and metrics.

        Health follows availability and the namespace: NOT_SERVING while the store refuses writes or
        cannot be reached (a :class:`StoreUnavailable` from ``stats`` too), or while its namespace
        is lost (``Store.namespace_lost``: found by ``healthy``); a logic error of ``stats`` (an
        :class:`Internal`: a bug, or a key changed by someone else) is logged and the previous
        statistics stay, with health SERVING.
        """
        try:
            healthy = bool(await self.store.healthy())
        except Exception as e:  # noqa: BLE001 - an unreachable store is "not serving"
            log.warning("store health check failed: %s", e)
            healthy = False
        if self._namespace_lost():
            healthy = False
        stats = None
        if healthy:
            try:
                stats = await self.store.stats(10)
                if self.config.pace_batches:  # the bound every replica applies: K x the learner's batch in the store
                    self.metrics.pace_bound.set(pace_limit(self.store.config, await self.store.pace.read_learner_batch()))
            except StoreUnavailable as e:
                log.warning("store stats failed: %s", e)
                healthy = False
            except Exception as e:  # noqa: BLE001
                log.error("store stats failed: %s", e)
        self.metrics.update(stats, healthy)
        await self.set_serving(healthy)

    def _namespace_lost(self) -> bool:
        """Export the store's namespace state (``prioreplay_namespace_lost``, and each new loss in
        ``prioreplay_namespace_losses_total``); True while it is lost."""
        new = self.store.namespace_losses - self._losses_counted
        if new > 0:
            self.metrics.namespace_losses.inc(new)
            self._losses_counted += new
        lost = self.store.namespace_lost is not None
        self.metrics.namespace_lost.set(1 if lost else 0)
        return lost

    def store_unavailable(self) -> None:
        """An RPC met a store outage or a lost namespace: health NOT_SERVING now (the next
        :meth:`refresh` that finds the store writable, and its namespace the claimed one, turns it
        back to SERVING). Call it on the server's event loop."""
        self._namespace_lost()
        self.metrics.update(None, False)
        if self._outage_task is None or self._outage_task.done():
            self._outage_task = asyncio.ensure_future(self.set_serving(False))

    async def reap(self) -> None:
        """Expire every overdue lease (in rounds of ``EXPIRE_LIMIT``); nothing while the namespace is lost."""
        if self.store.namespace_lost is not None:
            return
        total = 0
        while True:
            n = await self.store.expire_leases(EXPIRE_LIMIT)
            total += n
            if n < EXPIRE_LIMIT:
                break
        if total:
            log.info("expired %d overdue lease(s)", total)
            if self.store.config.pace_batches:  # their problems no longer count as ahead (pacing.py)
                await self.store.pace.signal()

    def start_tasks(self, server: grpc.aio.Server) -> None:
        """Start the reaper, the stats refresh and (when configured) the snapshot task; they are
        cancelled when ``server`` terminates, or by :meth:`stop_tasks`."""
        config = self.config
        self.tasks = [
            asyncio.create_task(_every(config.reaper_interval_s, self.reap, "lease reaper"), name="prioreplay-reaper"),
            asyncio.create_task(_every(config.stats_interval_s, self.refresh, "stats refresh"), name="prioreplay-stats"),
        ]
        if config.snapshot_interval_s > 0:
            self.tasks.append(
                asyncio.create_task(
                    _every(config.snapshot_interval_s, self.store.snapshot, "store snapshot"), name="prioreplay-snapshot"
                )
            )
        self.tasks.append(asyncio.create_task(_cancel_on_termination(server, self.tasks[:]), name="prioreplay-supervisor"))

    async def stop_tasks(self) -> None:
        """Cancel the background tasks and wait (bounded) until they end."""
        for t in self.tasks:
            t.cancel()
        await bounded(asyncio.gather(*self.tasks, return_exceptions=True), SHUTDOWN_STEP_S, "background tasks")


async def _every(interval_s: float, fn: Callable[[], Awaitable[None]], what: str) -> None:
    """Run ``fn`` every ``interval_s`` seconds until cancelled; failures are logged, not fatal."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await fn()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - keep the loop alive (Redis may come back)
            log.warning("%s failed: %s", what, e)


async def _cancel_on_termination(server: grpc.aio.Server, tasks: list[asyncio.Task]) -> None:
    try:
        await server.wait_for_termination()
    finally:
        for t in tasks:
            t.cancel()


#: Seconds each shutdown step may take beyond its grace period before shutdown goes on without it.
SHUTDOWN_STEP_S = 10.0


async def bounded(awaitable: Awaitable, timeout_s: float | None, what: str) -> None:
    """Await a shutdown step for at most ``timeout_s`` seconds (None: no bound); a step that
    overruns is logged and abandoned, so a stuck connection can never keep a process from exiting."""
    try:
        await asyncio.wait_for(awaitable, timeout_s)
    except TimeoutError:
        log.warning("shutdown: %s did not finish within %.0f s; going on without it", what, timeout_s)
