"""Entry points of ``prioreplay server``, ``prioreplay load`` and ``prioreplay stats``.

Each takes its typed configuration and returns the process exit code. Errors the user can fix
are raised as :mod:`prioreplay.errors` classes; the CLI prints them and exits with status 2.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from typing import Iterator, TextIO

from prioreplay.priority_server.config import LoadConfig, ServerConfig, StatsConfig

log = logging.getLogger("prioreplay.server")

#: Width of the priority histogram's longest bar, characters.
BAR_WIDTH = 40


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _grpc_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


# -- server ---------------------------------------------------------------------------------
def run(config: ServerConfig) -> int:
    """Run the priority server until SIGTERM/SIGINT.

    Logs where it listens (the bound port, also when ``--port 0``), the store with its password
    hidden, and the sampler. On a signal: health turns NOT_SERVING, new RPCs are refused,
    in-flight RPCs get ``grace_s`` seconds, then the store is closed (the memory store writes
    its snapshot).

    Returns:
        0 after a clean shutdown.

    Raises:
        InvalidArgument: bad store URL, unreadable TLS/token files, corrupt snapshot, or the
            port cannot be bound.
    """
    _setup_logging(config.log_level)
    return asyncio.run(_serve(config))


async def _serve(config: ServerConfig) -> int:
    from prioreplay.priority_server.metrics import ServerMetrics
    from prioreplay.priority_server.server import create_server, stop_server
    from prioreplay.priority_server.stores import create_store, redact_url

    store = create_store(config.store, config.to_store_config(), namespace=config.namespace,
                         snapshot_path=config.snapshot_path)
    metrics = ServerMetrics()
    try:
        server, port = await create_server(_grpc_address(config.host, config.port), store, config, metrics=metrics)
    except BaseException:
        await store.close()
        raise
    http = None
    try:
        if config.metrics_port:
            try:
                http, _ = metrics.serve(config.metrics_port, addr=config.host)
            except OSError as e:
                log.error("cannot serve /metrics on port %d: %s", config.metrics_port, e.strerror)
                raise
        log.info("prioreplay server listening on %s:%d (%s, auth %s); metrics %s", config.host, port,
                 "TLS" if config.tls_enabled else "plaintext", "on" if config.token() else "off",
                 f"on :{config.metrics_port}/metrics" if http else "off")
        if config.store == "memory" and config.snapshot_path is None:
            log.warning("memory store without --snapshot-path: its state is lost when the server stops; "
                        "pass --snapshot-path FILE to keep it across restarts")
        log.info("store %s (namespace %s), sampler %s (alpha %g, retest fraction %g every %d batches), "
                 "lease %gs, max batch %d", redact_url(config.store), config.namespace, config.sampler, config.alpha,
                 config.retest_fraction, config.retest_interval, config.lease_timeout_s, config.max_batch_size)
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


# -- load -----------------------------------------------------------------------------------
def _chunks(records: Iterator, chunk_size: int, failure: list[BaseException]) -> Iterator[list]:
    """Read ``chunk_size`` records at a time; stop (recording the error) at the first bad one.

    A chunk is yielded only once it was read whole, so nothing of a chunk holding a malformed
    line is sent.
    """
    while True:
        chunk = []
        try:
            for record in records:
                chunk.append(record)
                if len(chunk) >= chunk_size:
                    break
        except Exception as e:  # noqa: BLE001 - re-raised by run_load after the stream ends
            failure.append(e)
            return
        if not chunk:
            return
        yield chunk
        if len(chunk) < chunk_size:
            return


def run_load(config: LoadConfig) -> int:
    """Register a dataset's problems with a running server, streamed in chunks.

    Prints ``created=… updated=… total=…``. A malformed line fails with its file:line before
    anything of its chunk is sent; the chunks before it stay registered (the count is printed).

    Returns:
        0 when every problem was registered.

    Raises:
        InvalidArgument: malformed input (file:line), unknown source, or a problem the server
            refused (its index in the stream).
        StoreUnavailable: the server cannot be reached.
    """
    from tqdm import tqdm

    from prioreplay.client import PriorityClient, problem_to_proto
    from prioreplay.datasets import iter_problems

    records = iter_problems(config.source, split=config.split, id_column=config.id_column,
                            prompt_column=config.prompt_column, answer_column=config.answer_column,
                            verifier=config.verifier, id_prefix=config.id_prefix or None, limit=config.limit)
    failure: list[BaseException] = []
    sent = 0
    with PriorityClient(config, max_retries=2) as client, \
            tqdm(total=config.limit, unit="problem", desc="load", disable=None, file=sys.stderr) as bar:
        client.wait_ready(config.rpc_timeout_s)

        def problems():
            nonlocal sent
            for chunk in _chunks(records, config.chunk_size, failure):
                for r in chunk:
                    yield problem_to_proto(r)
                sent += len(chunk)
                bar.update(len(chunk))

        resp = client.register(problems(), chunk_size=config.chunk_size)
    if failure:
        print(f"registered {sent} problem(s) before the error (created={resp.created} updated={resp.updated} "
              f"total={resp.total})", file=sys.stderr)
        raise failure[0]
    print(f"created={resp.created} updated={resp.updated} total={resp.total}")
    return 0


# -- stats ----------------------------------------------------------------------------------
def stats_dict(resp) -> dict:
    """A GetStats response as a plain dict (every field, lists as lists) plus ``mean_reward``."""
    out: dict = {}
    for f in resp.DESCRIPTOR.fields:
        v = getattr(resp, f.name)
        out[f.name] = list(v) if f.is_repeated else v
    n = resp.completions_reported
    out["mean_reward"] = resp.reward_sum / n if n else 0.0
    return out


def format_stats(d: dict, width: int = BAR_WIDTH) -> str:
    """The text report of ``prioreplay stats``: pools, histogram bars, training counters."""
    lines = [
        f"problems       {d['problems']}",
        f"  heap         {d['heap_size']}",
        f"  solved       {d['solved']}",
        f"  unsolved     {d['unsolved']}",
        f"  leased       {d['leased']} (in {d['active_leases']} lease(s))",
        "",
        "priority histogram of the heap (p(1-p), Fatemi 2026):",
    ]
    hist, edges = d["priority_histogram"], d["priority_bucket_edges"]
    top = max(hist, default=0)
    for i, count in enumerate(hist):
        bar = "#" * (round(width * count / top) if top else 0)
        close = "]" if i == len(hist) - 1 else ")"
        lines.append(f"  [{edges[i]:.4f}, {edges[i + 1]:.4f}{close} {bar:<{width}} {count}")
    groups = d["groups_mixed"] + d["groups_all_correct"] + d["groups_all_wrong"] + d["groups_constant"]
    lines += [
        "",
        f"step           {d['step']}",
        f"policy version {d['policy_version']}" + (f" ({d['weights_uri']})" if d["weights_uri"] else ""),
        f"groups         {groups} (mixed {d['groups_mixed']}, all-correct {d['groups_all_correct']}, "
        f"all-wrong {d['groups_all_wrong']}, constant {d['groups_constant']})",
        f"effective-group fraction {d['effective_group_fraction']:.3f}",
        f"mean reward    {d['mean_reward']:.3f} over {d['completions_reported']} completion(s)",
        f"forgetting events {d['forgetting_events']}, breakthroughs {d['breakthroughs']}",
        f"lease expiries {d['lease_expiries']}, late reports {d['late_reports']}",
        f"trajectory queue depth {d['queue_depth']}, pending {d['pending_groups']}, acked {d['groups_acked']}",
    ]
    return "\n".join(lines)


def run_stats(config: StatsConfig, out: TextIO | None = None) -> int:
    """Print the server's statistics (text, or one JSON object with ``--as-json``).

    Returns:
        0.

    Raises:
        StoreUnavailable: the server cannot be reached; Unauthenticated: wrong token.
    """
    from prioreplay.client import PriorityClient

    out = out or sys.stdout
    with PriorityClient(config, max_retries=2) as client:
        d = stats_dict(client.stats(config.buckets))
    if config.as_json:
        print(json.dumps(d, sort_keys=True), file=out)
    else:
        print(format_stats(d), file=out)
    return 0
