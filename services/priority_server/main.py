"""Entry point of ``prioreplay server``: the store, the gRPC server, /metrics, until SIGTERM/SIGINT.

It takes its typed configuration and returns the process exit code. Errors the user can fix
are raised as :mod:`prioreplay.errors` classes; the CLI prints them and exits with status 2.
The client commands ``load`` and ``stats`` are in :mod:`.admin`.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from prioreplay.errors import InvalidArgument
from prioreplay.process import setup_logging

from .config import ServerConfig

log = logging.getLogger("prioreplay.server")


def _grpc_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


# -- server ---------------------------------------------------------------------------------
def run(config: ServerConfig) -> int:
    """Run the priority server until SIGTERM/SIGINT.

    Logs where it listens (the bound port, also when ``--port 0``), the store with its password
    hidden, and the sampler. With ``processes`` > 1, :func:`.processes.run_processes` runs that
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
    return asyncio.run(_serve(config))


def _child(config: ServerConfig, index: int) -> None:
    """One process of ``--processes N`` (spawned): the same server, bound with SO_REUSEPORT, its
    /metrics on a private 127.0.0.1 port that the parent aggregates."""
    from prioreplay.errors import FailedPrecondition, InvalidArgument

    setup_logging(config.log_level)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent turns Ctrl-C into one SIGTERM per process
    try:
        code = asyncio.run(
            _serve(config, reuse_port=True, label=f"process {index + 1}/{config.processes}", metrics_host="127.0.0.1")
        )
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


async def _serve(config: ServerConfig, *, reuse_port: bool = False, label: str = "", metrics_host: str | None = None) -> int:
    from .metrics import ServerMetrics
    from .open_store import create_store
    from .server import create_server, stop_server

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
            _grpc_address(config.host, config.port), store, config, metrics=metrics, reuse_port=reuse_port
        )
    except BaseException:
        await store.close()
        raise
    http = None
    try:
        if config.metrics_port:
            http = _serve_metrics(metrics, config.metrics_port, metrics_host or config.host)
        _log_start(config, port, label, metrics_on=http is not None)
        stop = asyncio.Event()
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
    log.info("stopped")
    return 0
