"""The priority server factory: servicer, health, reflection, interceptors, background tasks.

:func:`create_server` builds and starts a ``grpc.aio`` server around a :class:`Store`; tests bind
port 0 and stop it with :func:`stop_server`. Authentication and metrics are interceptors
(:mod:`.interceptors`); the tasks beside the server live in :mod:`.runtime`. A server on its own
thread for blocking callers (tests, benchmarks) is :class:`.background_server.BackgroundServer`.
"""

from __future__ import annotations

import logging
import weakref

import grpc
from grpc_health.v1 import health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from prioreplay.channel import channel_options
from prioreplay.errors import InvalidArgument, StoreUnavailable

from .backpressure import Backpressure
from .config import ServerConfig
from .interceptors import AuthInterceptor, MetricsInterceptor
from .metrics import ServerMetrics
from .runtime import SHUTDOWN_STEP_S, ServerRuntime, bounded
from .servicer import SERVICE_NAME, PriorityServicer
from .store import Store

log = logging.getLogger(__name__)

_RUNTIMES: weakref.WeakKeyDictionary[grpc.aio.Server, ServerRuntime] = weakref.WeakKeyDictionary()


def runtime_of(server: grpc.aio.Server) -> ServerRuntime:
    """The :class:`ServerRuntime` of a server made by :func:`create_server` (metrics, health, tasks)."""
    return _RUNTIMES[server]


# -- the factory ----------------------------------------------------------------------------
async def create_server(
    address: str,
    store: Store,
    config: ServerConfig | None = None,
    *,
    metrics: ServerMetrics | None = None,
    reuse_port: bool = False,
) -> tuple[grpc.aio.Server, int]:
    """Build, bind and start the priority server.

    Args:
        address: ``HOST:PORT`` to listen on (port 0: an ephemeral port).
        store: the store the servicer uses (the caller closes it after :func:`stop_server`).
        config: limits, auth, TLS and task intervals (defaults: :class:`ServerConfig` defaults).
        metrics: the metrics to update (default: a fresh registry; reach it via :func:`runtime_of`).
        reuse_port: share the port with other processes (SO_REUSEPORT; the kernel spreads incoming
            connections over them). Off by default, so a second server on a port in use fails.

    Returns:
        (the started server, the bound port). With TLS only a secure port is opened, so
        plaintext clients are refused.

    Raises:
        InvalidArgument: the address cannot be bound, or the TLS files / token file cannot be read.
    """
    config = config if config is not None else ServerConfig()
    metrics = metrics if metrics is not None else ServerMetrics()
    metrics.queue_bound.set(config.max_queue_depth)
    token = config.token()
    interceptors: list[grpc.aio.ServerInterceptor] = [MetricsInterceptor(metrics)]
    if token:
        interceptors.append(AuthInterceptor(token))
    # so_reuseport off unless asked: a second server on a port in use must fail, not silently share the clients
    options = [*channel_options(config.max_message_mb), ("grpc.so_reuseport", 1 if reuse_port else 0)]
    if config.max_connection_age_s > 0:
        # GOAWAY after the age (gRPC adds +-10% jitter): clients reconnect and resolve their target
        # again, so replicas added behind a dns:/// name get traffic from clients already connected
        options += [
            ("grpc.max_connection_age_ms", int(config.max_connection_age_s * 1000)),
            ("grpc.max_connection_age_grace_ms", int(config.max_connection_age_grace_s * 1000)),
        ]
    server = grpc.aio.server(interceptors=interceptors, options=options)
    backpressure = (
        Backpressure(store, config.max_queue_depth, config.backpressure_retry_s) if config.max_queue_depth > 0 else None
    )
    servicer = PriorityServicer(store, metrics, config.max_message_mb, backpressure)
    await check_run_settings(store, config, servicer)
    handlers = method_handlers(servicer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection((SERVICE_NAME, "grpc.health.v1.Health", reflection.SERVICE_NAME), server)
    port = _bind(server, address, config)
    await server.start()
    rt = ServerRuntime(store=store, config=config, metrics=metrics, health=health, port=port)
    _RUNTIMES[server] = rt
    servicer.on_store_unavailable = rt.store_unavailable
    await rt.refresh()
    rt.start_tasks(server)
    return server, port


async def check_run_settings(store: Store, config: ServerConfig, servicer: PriorityServicer) -> None:
    """Claim or check the namespace's run settings (:meth:`Store.claim_settings`) before serving.

    A store that cannot be reached now is checked before the first RPC it answers (every RPC
    awaits ``servicer.pending_check`` until one check passes), so a server may start before Redis.

    Raises:
        FailedPrecondition: the namespace was made with other settings (the message names each).
    """

    async def check() -> None:
        changes = await store.claim_settings(config.accept_setting_changes)
        servicer.pending_check = None
        if changes:
            log.warning(
                "run settings changed on this namespace (--accept-setting-changes): %s",
                ", ".join(f"{name} {old!r} -> {new!r}" for name, (old, new) in changes.items()),
            )

    try:
        await check()
    except StoreUnavailable as e:
        log.warning("run settings not checked yet (%s); they are checked before the first RPC the store answers", e)
        servicer.pending_check = check


#: Methods registered without a request deserializer: the servicer gets the received bytes.
RAW_REQUEST_METHODS = frozenset({"ReportOutcomes"})
#: Methods whose servicer answers the serialized response (or a message): sent as it is.
RAW_RESPONSE_METHODS = frozenset({"SampleProblems", "PullTrajectories"})


def _serialized(response) -> bytes:
    """A response as bytes: already serialized (:data:`RAW_RESPONSE_METHODS`) or a message."""
    return response if isinstance(response, bytes) else response.SerializeToString()


def method_handlers(servicer: PriorityServicer) -> dict[str, grpc.RpcMethodHandler]:
    """The handlers of every ``PriorityService`` method, as the generated
    ``add_PriorityServiceServicer_to_server`` makes them, except that the methods in
    :data:`RAW_REQUEST_METHODS` get the request bytes undecoded (the servicer decodes them and
    also reads the packed fields straight from the bytes, see :func:`.wire.report_groups`) and the
    methods in :data:`RAW_RESPONSE_METHODS` may answer bytes already serialized (:func:`.wire.lease_response`,
    :func:`.wire.pull_response`)."""
    from prioreplay.v1 import priority_service_pb2 as pb

    handlers = {}
    for m in pb.DESCRIPTOR.services_by_name["PriorityService"].methods:
        req = message_class(m.input_type)
        resp = message_class(m.output_type)
        make = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[(m.client_streaming, m.server_streaming)]
        handlers[m.name] = make(
            getattr(servicer, m.name),
            request_deserializer=None if m.name in RAW_REQUEST_METHODS else req.FromString,  # type: ignore[attr-defined]  # a generated message class, passed as type
            response_serializer=_serialized if m.name in RAW_RESPONSE_METHODS else resp.SerializeToString,  # type: ignore[attr-defined]  # a generated message class, passed as type
        )
    return handlers


def message_class(descriptor) -> type:
    """The generated class of a message descriptor of ``priority_service.proto``."""
    from prioreplay.v1 import priority_service_pb2 as pb

    return getattr(pb, descriptor.name)


def check_tls_pair(cert_file, key_file) -> None:
    """Check that a PEM certificate chain and private key load and belong together, with Python's
    ``ssl`` (gRPC would only fail to bind, which reads as a port problem).

    Raises:
        InvalidArgument: the certificate or key is not valid PEM, or the key does not match the
            certificate (the message names both files and OpenSSL's reason).
    """
    import ssl

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile=str(cert_file), keyfile=str(key_file))
    except ssl.SSLError as e:
        raise InvalidArgument(
            f"TLS certificate {str(cert_file)!r} and key {str(key_file)!r} are not a valid PEM "
            f"pair ({e.reason or e}); give --tls-cert-file and --tls-key-file of one certificate"
        ) from e


def _bind(server: grpc.aio.Server, address: str, config: ServerConfig) -> int:
    try:
        if config.tls_key_file is not None and config.tls_cert_file is not None:  # tls_enabled
            try:
                key = config.tls_key_file.read_bytes()
                cert = config.tls_cert_file.read_bytes()
            except OSError as e:
                raise InvalidArgument(f"TLS file {e.filename!r} cannot be read: {e.strerror}") from e
            check_tls_pair(config.tls_cert_file, config.tls_key_file)
            port = server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as e:
        raise InvalidArgument(f"cannot listen on {address!r} ({e}); choose a free --port or another --host") from e
    if port == 0:
        raise InvalidArgument(f"cannot listen on {address!r}; choose a free --port or another --host")
    return port


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
        await rt.stop_tasks()
