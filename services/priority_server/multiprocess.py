"""``prioreplay server --processes N``: N server processes on one port, one ``/metrics`` for all.

Each process is a full priority server (its own event loop, gRPC server, Redis connection pool,
lease reaper and stats refresh) bound with SO_REUSEPORT to the same port; the kernel spreads
incoming *connections* over them, so each client connection (a worker, a learner) is served by
one process. The Redis store keeps every change atomic in its Lua scripts, so leases, reports,
pulls, acknowledgements and publishing stay exactly-once whichever process answers. The memory
store lives inside one process and is refused (:class:`~.config.ServerConfig`).

The parent process only supervises: it owns the port (below), checks that it is free, starts the
N processes (``spawn``), serves the aggregated ``/metrics`` on ``--metrics-port`` and forwards
SIGTERM/SIGINT.

Exactly one group of processes owns a port. SO_REUSEPORT lets any process of the same user join a
port whose listeners all set it, so two groups started at the same moment both passed the "port is
free" check and shared the port, each connection landing on either run. The parent therefore holds
a *port sentinel* for its lifetime (:func:`claim_port`): a UDP socket bound to the same address and
port, without SO_REUSEADDR or SO_REUSEPORT. The kernel lets one socket bind it, applies to it the
address rules of the TCP port (``0.0.0.0`` conflicts with ``127.0.0.1``, two addresses do not), in
the same network namespace (the scope in which the TCP port could be shared: containers of one pod
see it, two hosts do not), and releases it when the parent dies however it dies, with nothing left
on disk. A lock file keyed by host:port was the other candidate: it needs a shared writable
directory, its key would have to spell every alias of an address the same, and its scope is a
filesystem, not the network namespace. The price: UDP port P on that address is taken too (a UDP
service already there is named in the refusal). The TCP check still runs after the claim, so a
port held by anything else (a one-process server, or children orphaned by a killed parent, which
exit within a heartbeat anyway) is refused as before.
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
When a child is restarted (below), the last exposition of its previous life is *retired*: its
counters, histograms and summaries stay in the sums (its gauges and store-derived series do not),
so the new life's counters add to them and nothing decreases.

A child that stops answering keeps its listener, and the kernel keeps sending it connections. Each
child writes a heartbeat every ``HEARTBEAT_INTERVAL_S`` from its event loop into a pipe the parent
reads (:func:`send_heartbeats`); a child silent for ``--heartbeat-timeout-s`` (stopped, hung, its
event loop blocked) is killed (SIGKILL, which also ends a stopped process) and started again on the
same port and metrics port, counted in ``prioreplay_server_process_restarts_total{process}`` (the
``PrioreplayServerProcessStalled`` alert). A child gets ``FIRST_HEARTBEAT_S`` for its first beat
(interpreter, imports). The pipe also tells a child that its parent is gone (the write fails): it
stops, so no orphan keeps the port.

If a child exits on its own, the parent stops the others and exits 1 (2 when the child refused to
start, exit 2: a bad setting, a namespace or a Redis it may not serve), so an orchestrator restarts
the whole server (and Prometheus sees one reset, of the whole server).
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

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
        "prioreplay_pace_groups_ahead",
        "prioreplay_pace_bound_groups",
    }
)
#: Seconds the parent waits for one child's /metrics.
SCRAPE_TIMEOUT_S = 2.0
#: Seconds between two heartbeats of a child.
HEARTBEAT_INTERVAL_S = 1.0
#: Seconds a child gets from its start to its first heartbeat (a fresh interpreter and its imports).
FIRST_HEARTBEAT_S = 120.0
#: Families a retired exposition keeps contributing to the sums: those that only grow.
_CUMULATIVE_TYPES = frozenset({"counter", "histogram", "summary"})
#: A child's entry point: ``child(config, index, heartbeat)`` runs one server (see :func:`run_processes`).
ChildMain = Callable[[ServerConfig, int, multiprocessing.connection.Connection], None]


def merge_exposition(texts: list[str], retired: Sequence[str] = ()) -> list[Metric]:
    """Merge the text expositions of several processes into one set of metric families.

    Samples of :data:`STORE_FAMILIES` come from one process: a counter's largest value over the
    texts (the freshest read of a store counter), any other sample from the first text that has
    the family. Every other sample is summed over the texts by (sample name, labels), except
    ``*_created`` timestamps (the earliest is kept). Put the texts of the processes that answered
    this scrape first. ``retired``: the last expositions of restarted processes' earlier lives;
    only their process-local counters, histograms and summaries are summed in.
    """
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple, float]] = {}
    for text, old in [(t, False) for t in texts] + [(t, True) for t in retired]:
        for fam in text_string_to_metric_families(text):
            if old and (fam.name in STORE_FAMILIES or fam.type not in _CUMULATIVE_TYPES):
                continue
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
        self.retired: dict[int, list[str]] = {}  # process index -> the last expositions of its earlier lives
        self.restarts = [0] * len(urls)  # process index -> times the parent restarted it
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

    def retire(self, i: int) -> None:
        """Process ``i`` was restarted: its last exposition is retired (see :func:`merge_exposition`)."""
        self.restarts[i] += 1
        if i in self.last:
            self.retired.setdefault(i, []).append(self.last.pop(i))

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
        restarts = CounterMetricFamily(
            "prioreplay_server_process_restarts",
            "server processes killed and started again by the parent (no heartbeat for --heartbeat-timeout-s)",
            labels=["process"],
        )
        retired = [text for i in sorted(self.retired) for text in self.retired[i]]
        for i in range(len(self.urls)):
            up.add_metric([str(i + 1)], 1.0 if i in answered else 0.0)
            restarts.add_metric([str(i + 1)], float(self.restarts[i]))
            lives = self.retired.get(i, []) + ([self.last[i]] if i in self.last else [])
            if lives:
                rpcs.add_metric([str(i + 1)], sum(_rpcs_handled(text) for text in lives))
        yield from merge_exposition([self.last[i] for i in order], retired)
        yield GaugeMetricFamily(
            "prioreplay_server_processes", "server processes whose /metrics answered this scrape", value=len(answered)
        )
        yield rpcs
        yield up
        yield restarts

    def close(self) -> None:
        """Stop the scraping threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def claim_port(host: str, port: int) -> socket.socket:
    """The port sentinel of a group of processes on ``host:port`` (see the module docstring): close it
    when the group has stopped.

    Raises:
        InvalidArgument: another group holds the port (or another program uses UDP ``port`` there).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_DGRAM)
    try:
        s.bind((host.strip("[]"), port))
    except OSError as e:
        s.close()
        raise InvalidArgument(
            f"cannot own {host}:{port} ({e.strerror}): another `prioreplay server --processes` group holds it (its "
            f"sentinel is UDP port {port}; `ss -lunp 'sport = :{port}'` names the process), or another program uses "
            f"UDP port {port}; stop that server or choose another --port"
        ) from e
    return s


def _check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host.strip("[]"), port))
        except OSError as e:
            raise InvalidArgument(f"cannot listen on {host}:{port} ({e.strerror}); choose a free --port or another --host") from e


def run_processes(config: ServerConfig, child: ChildMain) -> int:
    """Run ``config.processes`` server processes on one port until SIGTERM/SIGINT.

    Args:
        config: the server configuration (``port`` 0: a free port is chosen for all processes).
        child: the entry point of process ``i`` (a module-level function, as ``spawn`` needs):
            ``child(config, i, heartbeat)`` runs one server with SO_REUSEPORT and the private metrics
            port given in its ``config``, and runs :func:`send_heartbeats` on ``heartbeat``.

    Returns:
        0 after a clean shutdown of every process; 1 when a process exited on its own (the
        others are stopped), 2 when it refused to start (exit 2). A process that stops sending
        heartbeats is restarted, not counted as an exit.

    Raises:
        InvalidArgument: the port is in use or owned by another group, or ``/metrics`` cannot be served.
    """
    port = config.port or free_port(config.host if ":" not in config.host else "127.0.0.1")
    sentinel = claim_port(config.host, port)
    try:
        _check_port_free(config.host, port)
        return _run_group(config, child, port)
    finally:
        sentinel.close()


def _run_group(config: ServerConfig, child: ChildMain, port: int) -> int:
    """:func:`run_processes` once the port is owned."""
    private = [free_port() for _ in range(config.processes)] if config.metrics_port else []
    group = _Group(config, child, port, private)
    group.start()
    http = None
    stop = {"signum": 0}

    def on_signal(signum, _frame):
        stop["signum"] = signum

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    code = 0
    try:
        http, group.aggregate = _serve_metrics(config, private)
        log.info(
            "prioreplay server: %d processes on %s:%d (SO_REUSEPORT), pids %s; metrics %s",
            config.processes,
            config.host,
            port,
            ", ".join(str(c.process.pid) for c in group.children),
            f"on :{config.metrics_port}/metrics (all processes)" if http else "off",
        )
        code = group.watch(stop)
    finally:
        group.stop(config.grace_s + 20.0)
        if http is not None:
            http.shutdown()
        if group.aggregate is not None:
            group.aggregate.close()
        for sig, h in old.items():
            signal.signal(sig, h)
    if code == 0 and any(c.process.exitcode not in (0, -signal.SIGTERM) for c in group.children):
        code = 1
    log.info("stopped (%d processes)", len(group.children))
    return code


@dataclass
class _Child:
    """One server process, the read end of its heartbeat pipe, and when it last beat (monotonic s)."""

    index: int
    process: multiprocessing.process.BaseProcess
    beats: multiprocessing.connection.Connection
    last_beat: float = field(default_factory=time.monotonic)
    beaten: bool = False

    def drain(self, now: float) -> None:
        """Read the heartbeats written so far (non-blocking); any byte is a beat."""
        try:
            got = os.read(self.beats.fileno(), 4096)
        except BlockingIOError:
            return
        if got:
            self.last_beat, self.beaten = now, True


@dataclass
class _Group:
    """The children of one parent: started, watched (exits and heartbeats), restarted, stopped."""

    config: ServerConfig
    main: ChildMain
    port: int
    private: list[int]
    children: list[_Child] = field(default_factory=list)
    aggregate: AggregateCollector | None = None

    def start(self) -> None:
        """Spawn one process per server."""
        self.children = [self._spawn(i) for i in range(self.config.processes)]

    def _spawn(self, i: int) -> _Child:
        """Spawn process ``i`` on the port with its private metrics port (0: none) and a heartbeat pipe."""
        ctx = multiprocessing.get_context("spawn")
        beats, heartbeat = ctx.Pipe(duplex=False)
        cfg = self.config.model_copy(update={"port": self.port, "metrics_port": self.private[i] if self.private else 0})
        p = ctx.Process(target=self.main, args=(cfg, i, heartbeat), name=f"prioreplay-server-{i + 1}", daemon=False)
        p.start()
        heartbeat.close()  # the child holds the write end: its death (or ours) closes the pipe
        os.set_blocking(beats.fileno(), False)
        return _Child(i, p, beats)

    def watch(self, stop: dict) -> int:
        """Until a stop signal (0) or a child exits on its own (1; 2 when it refused to start): read
        heartbeats, restart a child silent for longer than allowed."""
        timeout = self.config.heartbeat_timeout_s
        while not stop["signum"]:
            waits = [c.process.sentinel for c in self.children] + [c.beats for c in self.children]
            multiprocessing.connection.wait(waits, timeout=0.5)
            now = time.monotonic()
            for c in self.children:
                c.drain(now)
            dead = [c.process for c in self.children if c.process.exitcode is not None]
            if dead and not stop["signum"]:
                log.error("server process %s exited with %s; stopping the others", dead[0].name, dead[0].exitcode)
                return 2 if dead[0].exitcode == 2 else 1
            for c in self.children:
                silent = now - c.last_beat
                if silent > (timeout if c.beaten else max(timeout, FIRST_HEARTBEAT_S)) and not stop["signum"]:
                    self.restart(c, silent)
        return 0

    def restart(self, c: _Child, silent_s: float) -> None:
        """Kill a silent child (SIGKILL ends a stopped one too) and start it again in its place."""
        log.error(
            "server process %s (pid %d) sent no heartbeat for %.1f s (stopped, hung, or its event loop blocked; "
            "--heartbeat-timeout-s %g): killing it and starting it again",
            c.process.name,
            c.process.pid,
            silent_s,
            self.config.heartbeat_timeout_s,
        )
        c.process.kill()
        c.process.join(10)
        c.beats.close()
        self.children[c.index] = self._spawn(c.index)
        if self.aggregate is not None:
            self.aggregate.retire(c.index)
        log.info("server process %s started again (pid %d)", c.process.name, self.children[c.index].process.pid)

    def stop(self, timeout_s: float) -> None:
        """SIGTERM every live child, wait up to ``timeout_s`` in all, then kill the stragglers."""
        procs = [c.process for c in self.children]
        for p in procs:
            if p.exitcode is None:
                p.terminate()  # SIGTERM
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.exitcode is None:
                log.warning("%s did not stop in time; killing it", p.name)
                p.kill()
                p.join(5)
        for c in self.children:
            c.beats.close()


async def send_heartbeats(heartbeat: multiprocessing.connection.Connection, on_parent_gone: Callable[[], None]) -> None:
    """A child's side of the heartbeat (run on its event loop until cancelled): one byte every
    :data:`HEARTBEAT_INTERVAL_S`, never blocking (a full pipe skips a beat). When the parent is gone
    (the write fails), ``on_parent_gone()`` is called once and the beats end."""
    fd = heartbeat.fileno()
    os.set_blocking(fd, False)
    while True:
        try:
            os.write(fd, b".")
        except BlockingIOError:  # the parent has not read for ~64 KiB of beats: it is busy, not gone
            pass
        except OSError:  # EPIPE: the read end closed, the parent died
            log.error("the parent process of this server process is gone; stopping")
            on_parent_gone()
            return
        await asyncio.sleep(HEARTBEAT_INTERVAL_S)


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
