"""The priority server factory: servicer, health, reflection, auth, TLS, metrics, background tasks.

:func:`create_server` builds and starts a ``grpc.aio`` server around a :class:`Store`; tests bind
port 0 and stop it with :func:`stop_server`. The background tasks (lease reaper, memory-store
snapshots, the refresh of ``/metrics`` and of the health status from ``store.stats()`` /
``store.healthy()``) live as long as the server and end when it stops.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from prioreplay.client import channel_options
from prioreplay.errors import InvalidArgument
from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.metrics import ServerMetrics
from prioreplay.priority_server.servicer import PriorityServicer
from prioreplay.priority_server.store import EXPIRE_LIMIT, Store
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["PriorityService"].full_name
HEALTH_PREFIX = "/grpc.health.v1.Health/"
_SERVICE_PREFIX = f"/{SERVICE_NAME}/"
UNAUTHENTICATED_DETAILS = "missing or wrong bearer token: send metadata 'authorization: Bearer <token>'"


# -- interceptors ---------------------------------------------------------------------------
def _rewrap(handler: grpc.RpcMethodHandler, behavior: Callable) -> grpc.RpcMethodHandler:
    """A handler of the same kind and serializers as ``handler`` running ``behavior``."""
    kw = dict(request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(behavior, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(behavior, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(behavior, **kw)
    return grpc.unary_unary_rpc_method_handler(behavior, **kw)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires metadata ``authorization: Bearer <token>`` on every RPC except ``grpc.health.v1``.

    The header is compared with :func:`hmac.compare_digest` (constant time); a missing or wrong
    one ends the RPC with UNAUTHENTICATED before the servicer runs. The token is never logged.

    Args:
        token: the shared secret (non-empty).

    Raises:
        InvalidArgument: ``token`` is empty.
    """

    def __init__(self, token: str):
        if not token:
            raise InvalidArgument("auth token is empty; give a non-empty token or disable auth")
        self._expected = f"Bearer {token}".encode("utf-8")

    def _authorized(self, metadata) -> bool:
        for key, value in metadata or ():
            if key == "authorization":
                given = value if isinstance(value, bytes) else value.encode("utf-8")
                return hmac.compare_digest(given, self._expected)
        return False

    async def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method.startswith(HEALTH_PREFIX):
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        if handler is None or self._authorized(handler_call_details.invocation_metadata):
            return handler

        async def deny(request_or_iterator, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_DETAILS)

        return _rewrap(handler, deny)


def _code_name(context) -> str:
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 - older grpc: no code() on aio contexts
        code = None
    if code is None:
        return "UNKNOWN"
    if isinstance(code, grpc.StatusCode):
        return code.name
    for c in grpc.StatusCode:  # an int from cygrpc
        if c.value[0] == code:
            return c.name
    return "UNKNOWN"


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Times every unary-response RPC of ``PriorityService`` and counts its non-OK status codes.

    Only the service's own method names become label values (bounded cardinality).
    """

    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        name = handler_call_details.method
        if handler is None or not name.startswith(_SERVICE_PREFIX) or handler.response_streaming:
            return handler
        method = name[len(_SERVICE_PREFIX):]
        inner = handler.stream_unary if handler.request_streaming else handler.unary_unary
        metrics = self.metrics

        async def timed(request_or_iterator, context):
            t0 = time.perf_counter()
            code = "OK"
            try:
                result = await inner(request_or_iterator, context)
                code = _code_name(context) if context.code() is not None else "OK"
                return result
            except asyncio.CancelledError:
                code = "CANCELLED"
                raise
            except BaseException:
                code = _code_name(context)
                raise
            finally:
                metrics.observe_rpc(method, time.perf_counter() - t0, code)

        return _rewrap(handler, timed)


# -- background tasks -----------------------------------------------------------------------
@dataclass
class ServerRuntime:
    """What lives beside a running server: its store, metrics, health servicer and tasks."""

    store: Store
    config: ServerConfig
    metrics: ServerMetrics
    health: health_aio.HealthServicer
    port: int
    tasks: list[asyncio.Task] = field(default_factory=list)

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", SERVICE_NAME):
            await self.health.set(service, status)

    async def refresh(self) -> None:
        """Poll ``store.healthy()`` and ``store.stats()``; update health status and metrics."""
        try:
            healthy = bool(await self.store.healthy())
        except Exception as e:  # noqa: BLE001 - an unreachable store is "not serving"
            log.warning("store health check failed: %s", e)
            healthy = False
        stats = None
        if healthy:
            try:
                stats = await self.store.stats(10)
            except Exception as e:  # noqa: BLE001
                log.warning("store stats failed: %s", e)
                healthy = False
        self.metrics.update(stats, healthy)
        await self.set_serving(healthy)

    async def reap(self) -> None:
        """Expire every overdue lease (in rounds of ``EXPIRE_LIMIT``)."""
        total = 0
        while True:
            n = await self.store.expire_leases(EXPIRE_LIMIT)
            total += n
            if n < EXPIRE_LIMIT:
                break
        if total:
            log.info("expired %d overdue lease(s)", total)


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


_RUNTIMES: "weakref.WeakKeyDictionary[grpc.aio.Server, ServerRuntime]" = weakref.WeakKeyDictionary()


def runtime_of(server: grpc.aio.Server) -> ServerRuntime:
    """The :class:`ServerRuntime` of a server made by :func:`create_server` (metrics, health, tasks)."""
    return _RUNTIMES[server]


# -- the factory ----------------------------------------------------------------------------
async def create_server(address: str, store: Store, config: ServerConfig | None = None, *,
                        metrics: ServerMetrics | None = None) -> tuple[grpc.aio.Server, int]:
    """Build, bind and start the priority server.

    Args:
        address: ``HOST:PORT`` to listen on (port 0: an ephemeral port).
        store: the store the servicer uses (the caller closes it after :func:`stop_server`).
        config: limits, auth, TLS and task intervals (defaults: :class:`ServerConfig` defaults).
        metrics: the metrics to update (default: a fresh registry; reach it via :func:`runtime_of`).

    Returns:
        (the started server, the bound port). With TLS only a secure port is opened, so
        plaintext clients are refused.

    Raises:
        InvalidArgument: the address cannot be bound, or the TLS files / token file cannot be read.
    """
    config = config if config is not None else ServerConfig()
    metrics = metrics if metrics is not None else ServerMetrics()
    token = config.token()
    interceptors: list[grpc.aio.ServerInterceptor] = [MetricsInterceptor(metrics)]
    if token:
        interceptors.append(AuthInterceptor(token))
    # so_reuseport off: a second server on a port in use must fail, not silently share the clients
    options = [*channel_options(config.max_message_mb), ("grpc.so_reuseport", 0)]
    server = grpc.aio.server(interceptors=interceptors, options=options)
    pb_grpc.add_PriorityServiceServicer_to_server(PriorityServicer(store, metrics), server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection((SERVICE_NAME, "grpc.health.v1.Health", reflection.SERVICE_NAME), server)
    port = _bind(server, address, config)
    await server.start()
    rt = ServerRuntime(store=store, config=config, metrics=metrics, health=health, port=port)
    _RUNTIMES[server] = rt
    await rt.refresh()
    rt.tasks = [
        asyncio.create_task(_every(config.reaper_interval_s, rt.reap, "lease reaper"), name="prioreplay-reaper"),
        asyncio.create_task(_every(config.stats_interval_s, rt.refresh, "stats refresh"), name="prioreplay-stats"),
    ]
    if config.snapshot_interval_s > 0:
        rt.tasks.append(asyncio.create_task(_every(config.snapshot_interval_s, store.snapshot, "store snapshot"),
                                            name="prioreplay-snapshot"))
    rt.tasks.append(asyncio.create_task(_cancel_on_termination(server, rt.tasks[:]), name="prioreplay-supervisor"))
    return server, port


def _bind(server: grpc.aio.Server, address: str, config: ServerConfig) -> int:
    try:
        if config.tls_enabled:
            try:
                key = config.tls_key_file.read_bytes()
                cert = config.tls_cert_file.read_bytes()
            except OSError as e:
                raise InvalidArgument(f"TLS file {e.filename!r} cannot be read: {e.strerror}") from e
            port = server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as e:
        raise InvalidArgument(f"cannot listen on {address!r} ({e}); choose a free --port or another --host") from e
    if port == 0:
        raise InvalidArgument(f"cannot listen on {address!r}; choose a free --port or another --host")
    return port


async def _cancel_on_termination(server: grpc.aio.Server, tasks: list[asyncio.Task]) -> None:
    try:
        await server.wait_for_termination()
    finally:
        for t in tasks:
            t.cancel()


async def stop_server(server: grpc.aio.Server, grace_s: float | None = 0.0) -> None:
    """Stop a server made by :func:`create_server` and end its background tasks.

    The health status turns NOT_SERVING first; new RPCs are refused at once and in-flight ones
    get ``grace_s`` seconds (None: wait for all) before they are cancelled. The store is not
    closed (its owner closes it).
    """
    rt = _RUNTIMES.get(server)
    if rt is not None:
        await bounded(rt.health.enter_graceful_shutdown(), SHUTDOWN_STEP_S, "health NOT_SERVING")
    await bounded(server.stop(grace_s), None if grace_s is None else grace_s + SHUTDOWN_STEP_S, "server stop")
    if rt is not None:
        for t in rt.tasks:
            t.cancel()
        await bounded(asyncio.gather(*rt.tasks, return_exceptions=True), SHUTDOWN_STEP_S, "background tasks")


#: Seconds each shutdown step may take beyond its grace period before shutdown goes on without it.
SHUTDOWN_STEP_S = 10.0


async def bounded(awaitable: Awaitable, timeout_s: float | None, what: str) -> None:
    """Await a shutdown step for at most ``timeout_s`` seconds (None: no bound); a step that
    overruns is logged and abandoned, so a stuck connection can never keep a process from exiting."""
    try:
        await asyncio.wait_for(awaitable, timeout_s)
    except asyncio.TimeoutError:
        log.warning("shutdown: %s did not finish within %.0f s; going on without it", what, timeout_s)


class BackgroundServer:
    """A priority server on its own event loop in a daemon thread, for blocking callers.

    Tests, benchmarks and the one-machine demo use it with the blocking
    :class:`prioreplay.client.PriorityClient`, which would deadlock on the server's own loop.

    Args:
        store_factory: builds the store; called on the server's loop (a Redis client binds to
            the loop that first uses it).
        config: server configuration (default: :class:`ServerConfig` defaults).
        address: where to listen (default: an ephemeral port on 127.0.0.1).

    Attributes (after :meth:`start`):
        port: the bound port; address: ``127.0.0.1:<port>`` for clients; store; server.

    Example::

        with BackgroundServer(lambda: create_store("memory", StoreConfig())) as srv:
            client = PriorityClient(ClientSettings(server=srv.address))
    """

    def __init__(self, store_factory: Callable[[], Store], config: ServerConfig | None = None,
                 address: str = "127.0.0.1:0"):
        self._factory = store_factory
        self._config = config
        self._bind_address = address
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = None
        self.store: Store | None = None
        self.server: grpc.aio.Server | None = None
        self.port = 0

    @property
    def address(self) -> str:
        """``HOST:PORT`` for a client (the bind host, 127.0.0.1 for a wildcard)."""
        host = self._bind_address.rpartition(":")[0]
        if host in ("", "0.0.0.0", "[::]"):
            host = "127.0.0.1"
        return f"{host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> "BackgroundServer":
        """Start the loop thread, build the store and the server. Raises what create_server raises."""
        import threading

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="prioreplay-server", daemon=True)
        self._thread.start()

        async def up():
            self.store = self._factory()
            try:
                self.server, self.port = await create_server(self._bind_address, self.store, self._config)
            except BaseException:
                await self.store.close()
                raise

        try:
            self.call(up(), timeout_s)
        except BaseException:
            self._shutdown_loop()
            raise
        return self

    def call(self, coro, timeout_s: float | None = 60.0):
        """Run a coroutine on the server's loop and return its result (e.g. ``srv.call(srv.store.dump())``)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    @property
    def runtime(self) -> ServerRuntime:
        """The server's :class:`ServerRuntime` (metrics, health)."""
        return runtime_of(self.server)

    def stop(self, grace_s: float = 0.0) -> None:
        """Stop the server, close the store (memory: writes its snapshot), end the thread. Idempotent."""
        if self._loop is None:
            return

        async def down():
            if self.server is not None:
                await stop_server(self.server, grace_s)
            if self.store is not None:
                await bounded(self.store.close(), SHUTDOWN_STEP_S, "store close")

        try:
            self.call(down(), grace_s + 5 * SHUTDOWN_STEP_S)  # every step inside is bounded
        finally:
            self._shutdown_loop()

    def _shutdown_loop(self) -> None:
        loop, self._loop = self._loop, None
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        loop.close()

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
