"""``prioreplay server --processes N``: N server processes on one port, one ``/metrics`` for all.

Each process is a full priority server (its own event loop, gRPC server, Redis connection pool,
lease reaper and stats refresh) bound with SO_REUSEPORT to the same port; the kernel spreads
incoming *connections* over them, so each client connection (a worker, a learner) is served by
one process. The Redis store keeps every change atomic in its Lua scripts, so leases, reports,
pulls, acknowledgements and publishing stay exactly-once whichever process answers. The memory
store lives inside one process and is refused (:class:`~.config.ServerConfig`).

The parent process only supervises: it checks that the port is free, starts the N processes
(``spawn``), serves the aggregated ``/metrics`` on ``--metrics-port`` and forwards SIGTERM/SIGINT.
Each child serves its own metrics on a private port on 127.0.0.1; the parent's ``/metrics`` sums
the process-local series (RPC latency histograms, error counters, served priorities, client
traffic) over the children and takes the store-derived series (pools, counters kept in Redis),
the same in every process up to each one's last refresh, from them: gauges from the first child
that answered, counters as the largest value any child reported (the freshest read of a counter
that only grows in the store). ``prioreplay_server_processes`` is the number of children that
answered the scrape, ``prioreplay_server_process_up{process}`` whether each did, and
``prioreplay_server_process_rpcs_total{process}`` the RPCs each has handled (the balance).

Counters never decrease between scrapes, whatever a child does. The children are scraped at once,
each for at most ``SCRAPE_TIMEOUT_S``; a child that does not answer in time (stalled, busy, paused)
contributes the last exposition it answered (a last-known-value cache), so a sum never drops and
``rate()`` never reads a reset. Its counters then stand still until it answers again with values
at least as large (a child's counters only grow while it lives). This cache was chosen over
prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``): that mode sums the
library's own instruments from files, but the server's custom collectors (store statistics,
traffic per kind of client) do not write such files and would still need a scrape of each child.
A child never restarts alone (below), so a cached exposition is only ever older than the child's
current one, never from a previous life of it.

If a child exits on its own, the parent stops the others and exits 1, so an orchestrator restarts
the whole server (and Prometheus sees one reset, of the whole server).
"""

from __future__ import annotations

import http.client
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from prioreplay.channel import free_port
from prioreplay.errors import InvalidArgument

from .config import ServerConfig

log = logging.getLogger("prioreplay.server")

#: Metric families derived from ``store.stats()``: the same in every process, taken from one.
STORE_FAMILIES = frozenset(
    {
        "prioreplay_store_healthy",
        "prioreplay_pool_size",
        "prioreplay_problems",
        "prioreplay_priority_bucket",
        "prioreplay_groups",
        "prioreplay_effective_group_fraction",
        "prioreplay_forgetting_events",
        "prioreplay_breakthroughs",
        "prioreplay_lease_expiries",
        "prioreplay_late_reports",
        "prioreplay_completions_reported",
        "prioreplay_groups_acked",
        "prioreplay_trajectory_queue_depth",
        "prioreplay_trajectory_pending",
        "prioreplay_trajectory_queue_bound",
        "prioreplay_policy_version",
        "prioreplay_sampler_step",
        "prioreplay_active_leases",
    }
)
#: Seconds the parent waits for one child's /metrics.
SCRAPE_TIMEOUT_S = 2.0


def merge_exposition(texts: list[str]) -> list[Metric]:
    """Merge the text expositions of several processes into one set of metric families.

    Samples of :data:`STORE_FAMILIES` come from one process: a counter's largest value over the
    texts (the freshest read of a store counter), any other sample from the first text that has
    the family. Every other sample is summed over the texts by (sample name, labels), except
    ``*_created`` timestamps (the earliest is kept). Put the texts of the processes that answered
    this scrape first.
    """
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple, float]] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            first = fam.name not in merged
            if first:
                merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                values[fam.name] = {}
            elif fam.name in STORE_FAMILIES and fam.type != "counter":
                continue
            acc = values[fam.name]
            for smp in fam.samples:
                key = (smp.name, tuple(sorted(smp.labels.items())))
                if key not in acc:
                    acc[key] = smp.value
                elif smp.name.endswith("_created"):
                    acc[key] = min(acc[key], smp.value)
                elif fam.name in STORE_FAMILIES:
                    acc[key] = max(acc[key], smp.value)
                else:
                    acc[key] += smp.value
    for name, fam in merged.items():
        for (sname, labels), v in values[name].items():
            fam.add_sample(sname, dict(labels), v)
    return list(merged.values())


def _rpcs_handled(text: str) -> float:
    """RPCs a process handled: the sum of its ``prioreplay_rpc_latency_seconds_count`` samples."""
    return sum(
        smp.value
        for fam in text_string_to_metric_families(text)
        if fam.name == "prioreplay_rpc_latency_seconds"
        for smp in fam.samples
        if smp.name.endswith("_count")
    )


def _fetch(url: str, timeout_s: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 - our own 127.0.0.1 URLs
        return r.read().decode("utf-8")


class AggregateCollector(Collector):
    """Scrapes the children's ``/metrics`` at each collect (all at once, each for at most
    ``timeout_s``) and yields the merged families; a child that does not answer contributes the
    last exposition it answered (see the module docstring: counters never decrease).

    Args:
        urls: each child's ``/metrics`` URL, in process order.
        timeout_s: seconds a child gets to answer one scrape.
    """

    def __init__(self, urls: list[str], timeout_s: float = SCRAPE_TIMEOUT_S):
        self.urls = urls
        self.timeout_s = timeout_s
        self.last: dict[int, str] = {}  # process index -> the last exposition it answered
        self._pool = ThreadPoolExecutor(max(1, len(urls)), thread_name_prefix="prioreplay-scrape")

    def _scrape(self) -> set[int]:
        """Scrape every child once; update :attr:`last`; return the indices of those that answered."""
        futures = [self._pool.submit(_fetch, url, self.timeout_s) for url in self.urls]
        deadline = time.monotonic() + self.timeout_s + 1.0  # a child that trickles bytes is cut off too
        answered = set()
        for i, (url, f) in enumerate(zip(self.urls, futures, strict=True)):
            try:
                self.last[i] = f.result(timeout=max(0.0, deadline - time.monotonic()))
                answered.add(i)
            except (OSError, http.client.HTTPException) as e:  # OSError includes TimeoutError
                log.warning("metrics of %s not available (%s); using its last known values", url, e)
        return answered

    def collect(self) -> Iterator[Metric]:
        answered = self._scrape()
        order = sorted(self.last, key=lambda i: (i not in answered, i))  # fresh first
        rpcs = CounterMetricFamily(
            "prioreplay_server_process_rpcs",
            "RPCs handled by each server process (how evenly SO_REUSEPORT spreads the connections)",
            labels=["process"],
        )
        up = GaugeMetricFamily(
            "prioreplay_server_process_up",
            "1 when the server process answered this scrape (0: its last known values are served)",
            labels=["process"],
        )
        for i in range(len(self.urls)):
            up.add_metric([str(i + 1)], 1.0 if i in answered else 0.0)
            if i in self.last:
                rpcs.add_metric([str(i + 1)], _rpcs_handled(self.last[i]))
        yield from merge_exposition([self.last[i] for i in order])
        yield GaugeMetricFamily(
            "prioreplay_server_processes", "server processes whose /metrics answered this scrape", value=len(answered)
        )
        yield rpcs
        yield up

    def close(self) -> None:
        """Stop the scraping threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host.strip("[]"), port))
        except OSError as e:
            raise InvalidArgument(f"cannot listen on {host}:{port} ({e.strerror}); choose a free --port or another --host") from e


def run_processes(config: ServerConfig, child: Callable[[ServerConfig, int], None]) -> int:
    """Run ``config.processes`` server processes on one port until SIGTERM/SIGINT.

    Args:
        config: the server configuration (``port`` 0: a free port is chosen for all processes).
        child: the entry point of process ``i`` (a module-level function, as ``spawn`` needs):
            ``child(config, i)`` runs one server with SO_REUSEPORT and the private metrics port
            given in its ``config``.

    Returns:
        0 after a clean shutdown of every process; 1 when a process exited on its own (the
        others are stopped).

    Raises:
        InvalidArgument: the port is in use, or ``/metrics`` cannot be served.
    """
    port = config.port or free_port(config.host if ":" not in config.host else "127.0.0.1")
    _check_port_free(config.host, port)
    private = [free_port() for _ in range(config.processes)] if config.metrics_port else []
    procs = _start_children(config, child, port, private)
    http = aggregate = None
    stop = {"signum": 0}

    def on_signal(signum, _frame):
        stop["signum"] = signum

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    code = 0
    try:
        http, aggregate = _serve_metrics(config, private)
        log.info(
            "prioreplay server: %d processes on %s:%d (SO_REUSEPORT), pids %s; metrics %s",
            config.processes,
            config.host,
            port,
            ", ".join(str(p.pid) for p in procs),
            f"on :{config.metrics_port}/metrics (all processes)" if http else "off",
        )
        code = _watch(procs, stop)
    finally:
        _stop_children(procs, config.grace_s + 20.0)
        if http is not None:
            http.shutdown()
        if aggregate is not None:
            aggregate.close()
        for sig, h in old.items():
            signal.signal(sig, h)
    if code == 0 and any(p.exitcode not in (0, -signal.SIGTERM) for p in procs):
        code = 1
    log.info("stopped (%d processes)", len(procs))
    return code


def _start_children(config: ServerConfig, child: Callable[[ServerConfig, int], None], port: int, private: list[int]) -> list:
    """Spawn one process per server, each on ``port`` with its private metrics port (0: none)."""
    ctx = multiprocessing.get_context("spawn")
    procs = []
    for i in range(config.processes):
        child_cfg = config.model_copy(update={"port": port, "metrics_port": private[i] if private else 0})
        p = ctx.Process(target=child, args=(child_cfg, i), name=f"prioreplay-server-{i + 1}", daemon=False)
        p.start()
        procs.append(p)
    return procs


def _serve_metrics(config: ServerConfig, private: list[int]):
    """The summed ``/metrics`` of every process on ``config.metrics_port``: (the HTTP server, its
    :class:`AggregateCollector`), or (None, None) when the port is 0.

    Raises:
        InvalidArgument: the port cannot be bound.
    """
    if not config.metrics_port:
        return None, None
    from prometheus_client import start_http_server

    registry = CollectorRegistry()
    aggregate = AggregateCollector([f"http://127.0.0.1:{p}/metrics" for p in private])
    registry.register(aggregate)
    try:
        http, _ = start_http_server(config.metrics_port, addr=config.host, registry=registry)
    except OSError as e:
        aggregate.close()
        raise InvalidArgument(f"cannot serve /metrics on port {config.metrics_port}: {e.strerror}") from e
    return http, aggregate


def _watch(procs: list, stop: dict) -> int:
    """Wait until a stop signal (0) or until a process exits on its own (1)."""
    while not stop["signum"]:
        multiprocessing.connection.wait([p.sentinel for p in procs], timeout=0.5)
        dead = [p for p in procs if p.exitcode is not None]
        if dead and not stop["signum"]:
            log.error("server process %s exited with %s; stopping the others", dead[0].name, dead[0].exitcode)
            return 1
    return 0


def _stop_children(procs: list, timeout_s: float) -> None:
    """SIGTERM every live process, wait up to ``timeout_s`` in all, then kill the stragglers."""
    for p in procs:
        if p.exitcode is None:
            os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.exitcode is None:
            log.warning("%s did not stop in time; killing it", p.name)
            p.kill()
            p.join(5)
