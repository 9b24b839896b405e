"""The priority server's Prometheus metrics, in the server's own registry.

Two kinds (every name listed in ``docs/METRICS.md``):

* Process-local instruments, updated as RPCs run: ``prioreplay_rpc_latency_seconds{method}``,
  ``prioreplay_rpc_errors_total{method,code}``, ``prioreplay_sampled_priority`` (the
  priorities served by SampleProblems), ``prioreplay_probes_total`` (problems served as
  screening probes) and ``prioreplay_task_sampled{,_priority}_total{task}`` (problems served and
  their priority sum per task, a bounded label set: :class:`~prioreplay.problems.TaskLabels`).
* Store-derived metrics, exported by a custom collector from the latest ``Store.stats()``
  (refreshed by the server every ``stats_interval_s``): pool sizes, the priority distribution,
  the step, the policy version, the trajectory queue and the counters that live in the store
  (groups by kind, forgetting events, breakthroughs, lease expiries, late reports). Because
  they come from the store they survive restarts and agree across server replicas.
* Traffic per kind of client, ``prioreplay_client_*{source}`` (see ``client_traffic.py``): counted by
  this process since it started.

Labels are method names, status codes, pools, group kinds, client kinds, bucket edges and at most
16 task names (the rest ``other``) only: no problem id,
prompt text, token, URL or worker id ever reaches ``/metrics``.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from prioreplay.errors import STORE_ERROR_KINDS
from prioreplay.problems import TaskLabels
from prioreplay.v1 import priority_service_pb2 as pb

from .client_traffic import ClientTally, ClientTallyCollector

if TYPE_CHECKING:  # pragma: no cover
    from .store.records import StoreStats

log = logging.getLogger(__name__)

#: Buckets of the RPC latency histogram, seconds (100 µs .. 30 s).
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Buckets of ``prioreplay_pace_wait_seconds``: a held call waits up to --pace-wait-s (10 s by default).
PACE_WAIT_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Buckets of the sampled-priority histogram: tenths of the maximum priority 0.25.
PRIORITY_BUCKETS = tuple(round(0.025 * i, 3) for i in range(1, 11))


class BatchHistogram(Collector):
    """A Prometheus histogram filled a batch of values at a time (one call per SampleProblems,
    not one ``Histogram.observe`` per problem); exported as prometheus_client's ``Histogram``
    exports it: cumulative ``<name>_bucket{le}`` (``le`` = each bound and ``+Inf``), ``_count``
    and ``_sum``.

    A value v counts in the first bucket whose bound b has v <= b (``Histogram.observe``'s rule).
    ``observe`` runs on the event loop and ``collect`` in the metrics thread, so both hold a lock.
    """

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = np.asarray([*buckets, math.inf], dtype=np.float64)  # (K + 1,) ascending
        self.counts = np.zeros(self.bounds.size, dtype=np.int64)  # (K + 1,) per bucket, not cumulative
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe(self, values: list[float]) -> None:
        """Count ``values`` (any number, 0 included) into their buckets and add them to the sum."""
        if not values:
            return
        a = np.asarray(values, dtype=np.float64)  # (n,)
        per_bucket = np.bincount(np.searchsorted(self.bounds, a, side="left"), minlength=self.bounds.size)
        with self._lock:
            self.counts += per_bucket[: self.bounds.size]  # a NaN sorts past +Inf: counted in no bucket, as Histogram does
            self.sum += float(a.sum())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            cumulative = np.cumsum(self.counts).tolist()
            total = self.sum
        family = HistogramMetricFamily(
            self.name,
            self.documentation,
            buckets=[(floatToGoString(b), n) for b, n in zip(self.bounds.tolist(), cumulative, strict=True)],
            sum_value=total,
        )
        yield family


class StoreStatsCollector(Collector):
    """Exports the latest :class:`StoreStats` (None until the first refresh: nothing exported)."""

    def __init__(self) -> None:
        self.latest: StoreStats | None = None
        self.healthy: bool | None = None

    def collect(self) -> Iterator[Metric]:
        s = self.latest
        if self.healthy is not None:
            yield GaugeMetricFamily(
                "prioreplay_store_healthy", "1 when the store answered its health check", value=1.0 if self.healthy else 0.0
            )
        if s is None:
            return
        yield from _place_metrics(s)
        yield from _group_metrics(s)
        yield from _store_counts(s)


def _place_metrics(s: StoreStats) -> Iterator[Metric]:
    """Problems per place, registered, and the heap's priority distribution (cumulative buckets)."""
    pools = GaugeMetricFamily(
        "prioreplay_pool_size", "problems per place (heap/solved/unsolved/leased/quarantined)", labels=["pool"]
    )
    for pool, n in (
        ("heap", s.heap_size),
        ("solved", s.solved),
        ("unsolved", s.unsolved),
        ("leased", s.leased),
        ("quarantined", s.quarantined),
    ):
        pools.add_metric([pool], n)
    yield pools
    yield GaugeMetricFamily("prioreplay_problems", "problems registered", value=s.problems)
    buckets = GaugeMetricFamily(
        "prioreplay_priority_bucket",
        "heap problems with priority below le (the last edge, 0.25, inclusive): the current distribution",
        labels=["le"],
    )
    cumulative = 0
    for count, edge in zip(s.priority_histogram, s.priority_bucket_edges[1:], strict=True):
        cumulative += count
        buckets.add_metric([f"{edge:.6g}"], cumulative)
    yield buckets


def _group_metrics(s: StoreStats) -> Iterator[Metric]:
    """Reported groups by kind and the share with a GRPO gradient (mixed)."""
    groups = CounterMetricFamily("prioreplay_groups", "reported groups by kind since the run began", labels=["kind"])
    for kind, n in (
        ("mixed", s.groups_mixed),
        ("all_correct", s.groups_all_correct),
        ("all_wrong", s.groups_all_wrong),
        ("constant", s.groups_constant),
    ):
        groups.add_metric([kind], n)
    yield groups
    yield GaugeMetricFamily(
        "prioreplay_effective_group_fraction",
        "mixed groups / all reported groups (groups with a GRPO gradient)",
        value=s.effective_group_fraction,
    )


def _store_counts(s: StoreStats) -> Iterator[Metric]:
    """The counters and gauges the store keeps: retest outcomes, leases, the queue, the policy."""
    for name, doc, value in (
        ("prioreplay_forgetting_events", "solved problems that failed a retest", s.forgetting_events),
        ("prioreplay_breakthroughs", "unsolved problems that passed a retest", s.breakthroughs),
        ("prioreplay_lease_expiries", "leases that expired before their report", s.lease_expiries),
        ("prioreplay_late_reports", "reports refused: lease unknown, expired or already reported", s.late_reports),
        ("prioreplay_completions_reported", "completions reported", s.completions_reported),
        ("prioreplay_groups_acked", "trajectory groups acknowledged by learners", s.groups_acked),
    ):
        yield CounterMetricFamily(name, doc, value=value)
    for name, doc, value in (
        ("prioreplay_trajectory_queue_depth", "groups queued, never delivered", s.queue_depth),
        ("prioreplay_trajectory_pending", "groups delivered, not yet acknowledged", s.pending_groups),
        ("prioreplay_policy_version", "newest published policy version", s.policy_version),
        ("prioreplay_sampler_step", "batches served (the retest schedule's clock)", s.step),
        ("prioreplay_active_leases", "leases out", s.active_leases),
        (
            "prioreplay_pace_groups_ahead",
            "groups ahead of the learner: queued and never delivered, plus problems leased and not reported "
            "(the pace bound keeps it within prioreplay_pace_bound_groups)",
            s.queue_depth + s.leased,
        ),
    ):
        yield GaugeMetricFamily(name, doc, value=value)
    yield GaugeMetricFamily(
        "prioreplay_unseen_priority", "priority every unseen heap problem holds (--unseen-prior)", value=s.unseen_priority
    )


class ServerMetrics:
    """The server's registry and instruments.

    Args:
        registry: where to register (a fresh :class:`CollectorRegistry` by default, so tests and
            several servers in one process do not collide).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.rpc_latency = Histogram(
            "prioreplay_rpc_latency_seconds",
            "RPC handling time, seconds",
            ["method"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.rpc_errors = Counter(
            "prioreplay_rpc_errors_total",
            "RPCs that ended with a status other than OK",
            ["method", "code"],
            registry=self.registry,
        )
        self.store_errors = Counter(
            "prioreplay_store_errors_total",
            "store errors that ended an RPC, by kind (unreachable, read only, out of memory, busy: UNAVAILABLE; logic: INTERNAL)",
            ["kind"],
            registry=self.registry,
        )
        # Bounded label values exist from the start, so a dashboard reads 0 on a healthy server
        # rather than "No data" (tests/system/deploy/test_dashboard_series.py).
        for kind in STORE_ERROR_KINDS:
            self.store_errors.labels(kind)
        for method in pb.DESCRIPTOR.services_by_name["PriorityService"].methods_by_name:
            self.rpc_latency.labels(method)
        self.backpressure_refusals = Counter(
            "prioreplay_backpressure_refusals",
            "SampleProblems answered with an empty batch because the trajectory queue was at or over --max-queue-depth",
            registry=self.registry,
        )
        #: ``--max-queue-depth`` (0: no bound), set by ``create_server``; with
        #: ``prioreplay_trajectory_queue_depth`` it tells an alert how near backpressure the queue is
        #: (deploy/prometheus/alerts.yml, ``TrajectoryQueueNearBound``).
        self.queue_bound = Gauge(
            "prioreplay_trajectory_queue_bound",
            "--max-queue-depth: leases are refused while this many groups wait undelivered (0: no bound)",
            registry=self.registry,
        )
        self.pace_wait_seconds = Histogram(
            "prioreplay_pace_wait_seconds",
            "seconds a SampleProblems call was held by the pace bound (--pace-batches) waiting for the learner, "
            "one observation per held call (its sum over the wall time: worker-seconds idle on pacing)",
            buckets=PACE_WAIT_BUCKETS_S,
            registry=self.registry,
        )
        self.pace_bound = Gauge(
            "prioreplay_pace_bound_groups",
            "--pace-batches x the learner's batch in groups: the most groups ahead of the learner "
            "(0: no pace bound, or the learner's batch not known yet)",
            registry=self.registry,
        )
        self.namespace_lost = Gauge(
            "prioreplay_namespace_lost",
            "1 while the run namespace this server claimed is gone, older or another run's in the store "
            "(health NOT_SERVING, every RPC FAILED_PRECONDITION); summed over the processes of --processes N",
            registry=self.registry,
        )
        self.namespace_losses = Counter(
            "prioreplay_namespace_losses",
            "times this server found its run namespace lost (flushed, an empty replica promoted, an older snapshot)",
            registry=self.registry,
        )
        self.problems_quarantined = Counter(
            "prioreplay_problems_quarantined",
            "problems reported unservable (prompt over a worker's model context) "
            "and quarantined, since this server process started",
            registry=self.registry,
        )
        self.sampled_priority = BatchHistogram("prioreplay_sampled_priority", "priority of each problem served", PRIORITY_BUCKETS)
        self.registry.register(self.sampled_priority)
        self.probes = Counter(
            "prioreplay_probes",
            "problems served as screening probes (a group_size below the worker's G, set by the sampler)",
            registry=self.registry,
        )
        self.task_labels = TaskLabels()
        self.task_sampled = Counter(
            "prioreplay_task_sampled",
            "problems served, by task (problem metadata 'task', else its source or verifier; "
            f"at most {self.task_labels.limit} tasks, the rest 'other')",
            ["task"],
            registry=self.registry,
        )
        self.task_sampled_priority = Counter(
            "prioreplay_task_sampled_priority",
            "sum of the priorities of the problems served, by task (over prioreplay_task_sampled_total: the mean)",
            ["task"],
            registry=self.registry,
        )
        self.store_stats = StoreStatsCollector()
        self.registry.register(self.store_stats)
        self.clients = ClientTally()
        self.registry.register(ClientTallyCollector(self.clients))

    def observe_rpc(self, method: str, seconds: float, code: str) -> None:
        """Record one RPC: its latency (seconds) and, when ``code`` is not "OK", an error."""
        self.rpc_latency.labels(method).observe(seconds)
        if code != "OK":
            self.rpc_errors.labels(method, code).inc()

    def observe_sampled(self, priorities: list[float], probes: int = 0, tasks: Sequence[str] = ()) -> None:
        """Record the priorities of the problems of one served batch (one histogram update for the
        whole batch), how many were probes, and, given each problem's task (:func:`problem_task`,
        same order as ``priorities``), the count and priority sum per task label."""
        self.sampled_priority.observe(priorities)
        if probes:
            self.probes.inc(probes)
        by_task: dict[str, list[float]] = {}
        for task, priority in zip(tasks, priorities if tasks else (), strict=True):
            by_task.setdefault(self.task_labels.label(task), []).append(priority)
        for label, values in by_task.items():
            self.task_sampled.labels(label).inc(len(values))
            self.task_sampled_priority.labels(label).inc(sum(values))

    def update(self, stats: StoreStats | None, healthy: bool) -> None:
        """Replace the exported store statistics (None keeps the previous ones) and health."""
        if stats is not None:
            self.store_stats.latest = stats
        self.store_stats.healthy = healthy

    def render(self) -> bytes:
        """The text exposition of the registry (what ``/metrics`` serves)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def serve(self, port: int, addr: str = "0.0.0.0"):
        """Serve ``/metrics`` on ``addr:port`` in a daemon thread.

        Returns:
            The (server, thread) pair of :func:`prometheus_client.start_http_server`; call
            the server's ``shutdown()`` to stop it.

        Raises:
            OSError: the port is taken.
        """
        from prometheus_client import start_http_server

        return start_http_server(port, addr=addr, registry=self.registry)
