"""The one place a priority server is built from its settings (``prioreplay server`` runs :func:`run`).

Read top to bottom:

- :func:`create_server` builds and starts the ``grpc.aio`` server around a :class:`Store`: the
  servicer (:mod:`.servicer`, decoding through :mod:`.wire`), the interceptors for metrics and
  authentication (:mod:`.interceptors`), the lease gate (:mod:`.pacing`: pace and queue bounds), health and
  reflection, the run-settings check, and the background tasks (:mod:`.runtime`). Tests bind
  port 0 and stop it with :func:`stop_server`.
- :func:`serve` is one server process: the store (:mod:`.open_store`), the metrics registry
  (:mod:`.metrics`), :func:`create_server`, ``/metrics`` over HTTP, and the signal handling.
- :func:`run` is the command: one :func:`serve`, or ``--processes N`` of them under a supervising
  parent that sums their metrics (:mod:`.multiprocess`).

The parts it composes live in those modules; a server on its own thread for blocking callers
(tests, benchmarks) is :class:`.background_server.BackgroundServer`; the client commands ``load``
and ``stats`` are in :mod:`.admin`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import weakref

import grpc
from grpc_health.v1 import health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from prioreplay.channel import channel_options
from prioreplay.errors import InvalidArgument, StoreUnavailable
from prioreplay.process import setup_logging

from .config import ServerConfig
from .interceptors import AuthInterceptor, MetricsInterceptor
from .metrics import ServerMetrics
from .open_store import create_store
from .pacing import Pacing
from .runtime import SHUTDOWN_STEP_S, ServerRuntime, bounded
from .servicer import SERVICE_NAME, PriorityServicer
from .store import Store

log = logging.getLogger("prioreplay.server")

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
    freeze_gc: bool = False,
) -> tuple[grpc.aio.Server, int]:
    """Build, bind and start the priority server.

    Args:
        address: ``HOST:PORT`` to listen on (port 0: an ephemeral port).
        store: the store the servicer uses (the caller closes it after :func:`stop_server`).
        config: limits, auth, TLS and task intervals (defaults: :class:`ServerConfig` defaults).
        metrics: the metrics to update (default: a fresh registry; reach it via :func:`runtime_of`).
        reuse_port: share the port with other processes (SO_REUSEPORT; the kernel spreads incoming
            connections over them). Off by default, so a second server on a port in use fails.
        freeze_gc: a process of its own (``prioreplay server``): the store's long-lived state (a
            restored snapshot at start, the problems after each RegisterProblems) is moved out of
            the cyclic collector's scans (``gc.freeze``), which otherwise rescan every problem's
            objects at each full collection the report path's allocations trigger. Off for a server
            that shares its process (tests, the demo's in-process server).

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
    pacing = Pacing(store, config.max_queue_depth, config.backpressure_retry_s, config.pace_wait_s, metrics)
    servicer = PriorityServicer(store, metrics, config.max_message_mb, pacing)
    if freeze_gc:
        servicer.on_registered = gc.freeze
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
    """Refuse a store that evicts (:meth:`Store.check_eviction`), claim the namespace's identity
    (:meth:`Store.claim_namespace`, with ``--accept-namespace-loss``) and claim or check its run
    settings (:meth:`Store.claim_settings`) before serving.

    A store that cannot be reached now is checked before the first RPC it answers (every RPC
    awaits ``servicer.pending_check`` until one check passes), so a server may start before Redis.

    Raises:
        FailedPrecondition: the namespace was made with other settings (the message names each), a
            server found it lost and nothing restored it (without ``--accept-namespace-loss``), or
            Redis's ``maxmemory-policy`` deletes keys (named, with ``CONFIG SET maxmemory-policy noeviction``).
    """

    async def check() -> None:
        await store.check_eviction()
        await store.claim_namespace(config.accept_namespace_loss)  # logs what it claimed
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


def _grpc_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


# -- the process: settings -> store, metrics, server, /metrics, signals ----------------------
def run(config: ServerConfig) -> int:
    """Run the priority server until SIGTERM/SIGINT.

    Logs where it listens (the bound port, also when ``--port 0``), the store with its password
    hidden, and the sampler. With ``processes`` > 1, :func:`.multiprocess.run_processes` runs that
    many copies of this server on one port (SO_REUSEPORT) under a supervising parent. On a signal: health
    turns NOT_SERVING, new RPCs are refused,
    in-flight RPCs get ``grace_s`` seconds, then the store is closed (the memory store writes
    its snapshot).

    Returns:
        0 after a clean shutdown.

    Raises:
        InvalidArgument: bad store URL, unreadable TLS/token files, corrupt snapshot, or the
            port cannot be bound.
    """
    setup_logging(config.log_level)
    if config.processes > 1:
        from .multiprocess import run_processes

        return run_processes(config, _child)
    return asyncio.run(serve(config))


def _child(config: ServerConfig, index: int, heartbeat=None) -> None:
    """One process of ``--processes N`` (spawned): the same server, bound with SO_REUSEPORT, its
    /metrics on a private 127.0.0.1 port that the parent aggregates, beating on ``heartbeat`` (the
    write end of the parent's pipe, :func:`.multiprocess.send_heartbeats`)."""
    from prioreplay.errors import FailedPrecondition, InvalidArgument

    setup_logging(config.log_level)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent turns Ctrl-C into one SIGTERM per process
    label = f"process {index + 1}/{config.processes}"
    try:
        code = asyncio.run(serve(config, reuse_port=True, label=label, metrics_host="127.0.0.1", heartbeat=heartbeat))
    except (InvalidArgument, FailedPrecondition) as e:  # a bad setting, or one the namespace refuses
        log.error("%s", e)
        code = 2
    raise SystemExit(code)


#: Hosts that bind only the loopback interface.
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def _warn_about(config: ServerConfig) -> None:
    """Log where the memory store's state goes, and warn about settings that expose or lose it."""
    if config.store == "memory":
        if config.snapshot_path is None:
            log.warning(
                "memory store without --snapshot-path: its state is lost when the server stops; "
                "pass --snapshot-path FILE to keep it across restarts"
            )
        else:
            log.info("memory store snapshots to %s", config.snapshot_path)
    if not config.token() and config.host not in _LOOPBACK_HOSTS:
        log.warning(
            "listening on %s without a token: anyone who reaches this port can lease, report and "
            "publish; set --auth-token-file (or PRIOREPLAY_AUTH_TOKEN), or --host 127.0.0.1",
            config.host,
        )


def _serve_metrics(metrics, port: int, host: str):
    """Serve ``metrics`` on ``host:port``/metrics; returns the HTTP server.

    Raises:
        InvalidArgument: the port is taken (or not ours to bind); the message names the flag.
    """
    try:
        http, _ = metrics.serve(port, addr=host)
    except OSError as e:
        raise InvalidArgument(
            f"cannot serve /metrics on port {port} ({e.strerror}); choose a free --metrics-port, or 0 to serve no metrics"
        ) from e
    return http


def _log_start(config: ServerConfig, port: int, label: str, *, metrics_on: bool) -> None:
    """Log where the server listens, its security and store settings, and the warnings about them."""
    from prioreplay.redact import redact_url

    log.info(
        "prioreplay server%s listening on %s:%d (%s, auth %s); metrics %s",
        f" {label}" if label else "",
        config.host,
        port,
        "TLS" if config.tls_enabled else "plaintext",
        "on" if config.token() else "off",
        f"on :{config.metrics_port}/metrics" if metrics_on else "off",
    )
    _warn_about(config)
    log.info(
        "store %s (namespace %s), sampler %s (alpha %g, retest fraction %g every %d %s), "
        "decay %g, prior (%g, %g), seed %d, lease %gs, max batch %d",
        redact_url(config.store),
        config.namespace,
        config.sampler,
        config.alpha,
        config.retest_fraction,
        config.retest_versions or config.retest_interval,
        "policy versions" if config.retest_versions else "batches",
        config.decay,
        config.prior_alpha,
        config.prior_beta,
        config.seed,
        config.lease_timeout_s,
        config.max_batch_size,
    )


async def serve(
    config: ServerConfig, *, reuse_port: bool = False, label: str = "", metrics_host: str | None = None, heartbeat=None
) -> int:
    """Build everything one server process runs from its settings, serve until SIGTERM/SIGINT, then
    stop in order: the store (:func:`.open_store.create_store`), the metrics registry, the gRPC
    server with its servicer, interceptors, health and background tasks (:func:`create_server`),
    and ``/metrics`` over HTTP. ``reuse_port``, ``label``, ``metrics_host`` and ``heartbeat`` are
    set by a process of ``--processes N`` (:func:`_child`): its heartbeats start first, so that the
    parent sees a process whose store is slow to open as alive, and it stops when the parent is gone.

    Returns:
        0 after a clean shutdown.

    Raises:
        InvalidArgument: bad store URL, unreadable TLS/token files, corrupt snapshot, or a port
            that cannot be bound.
        FailedPrecondition: the namespace was made with other run settings.
    """
    stop = asyncio.Event()
    beats = None
    if heartbeat is not None:
        from .multiprocess import send_heartbeats

        beats = asyncio.create_task(send_heartbeats(heartbeat, stop.set), name="prioreplay-heartbeat")
    store = create_store(
        config.store,
        config.to_store_config(),
        namespace=config.namespace,
        snapshot_path=config.snapshot_path,
        replication=config.replication(),
    )
    metrics = ServerMetrics()
    try:
        server, port = await create_server(
            _grpc_address(config.host, config.port), store, config, metrics=metrics, reuse_port=reuse_port, freeze_gc=True
        )
        gc.freeze()  # the state a snapshot restored: long-lived, out of the collector's scans
    except BaseException:
        await store.close()
        raise
    http = None
    try:
        if config.metrics_port:
            http = _serve_metrics(metrics, config.metrics_port, metrics_host or config.host)
        _log_start(config, port, label, metrics_on=http is not None)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("shutting down: refusing new RPCs, draining in-flight ones for up to %gs", config.grace_s)
    finally:
        await stop_server(server, config.grace_s)
        await store.close()  # not bounded: the memory store writes its final snapshot here
        if http is not None:
            http.shutdown()
        if beats is not None:
            beats.cancel()
    log.info("stopped")
    return 0
