"""Traffic per kind of client: the bounded ``source`` label of metrics and ``GetStats.clients``.

SampleProblems and ReportOutcomes requests carry a :class:`ClientSource` (``worker``, ``trl``,
``verl``, ``torch``; ``unspecified`` for old clients and for values this server does not know),
so a run that mixes rollout workers with trainer integrations can tell them apart. The counts are
kept in this server process only (they are not in the store): they start at 0 after a restart and
each replica counts its own RPCs. The store's counters stay the source of truth for the totals.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from prioreplay import rules
from prioreplay.v1 import priority_service_pb2 as pb

#: ClientSource value -> label. Every label the metrics can carry is here (bounded cardinality).
LABELS: dict[int, str] = {
    pb.CLIENT_SOURCE_UNSPECIFIED: "unspecified",
    pb.CLIENT_SOURCE_WORKER: "worker",
    pb.CLIENT_SOURCE_TRL: "trl",
    pb.CLIENT_SOURCE_VERL: "verl",
    pb.CLIENT_SOURCE_TORCH: "torch",
}


def normalize(source: int) -> int:
    """The ClientSource value to count under: a value this server does not know counts as unspecified."""
    return source if source in LABELS else pb.CLIENT_SOURCE_UNSPECIFIED


@dataclass
class ClientCounts:
    """What one kind of client did (field meanings as in the proto's ``ClientStats``)."""

    leases: int = 0
    problems_sampled: int = 0
    groups_by_kind: dict[str, int] = field(default_factory=dict)
    completions: int = 0
    reward_sum: float = 0.0
    late_reports: int = 0

    @property
    def groups(self) -> int:
        return sum(self.groups_by_kind.values())


class ClientTally:
    """Counts per ClientSource, updated by the servicer; read by GetStats and ``/metrics``."""

    def __init__(self) -> None:
        self.counts: dict[int, ClientCounts] = {}

    def _of(self, source: int) -> ClientCounts:
        return self.counts.setdefault(normalize(source), ClientCounts())

    def sampled(self, source: int, problems: int) -> None:
        """Record a served SampleProblems call that leased ``problems`` (≥ 1) problems."""
        c = self._of(source)
        c.leases += 1
        c.problems_sampled += problems

    def reported(
        self, source: int, accepted: bool, groups: Iterable[Sequence[float]], kinds: Sequence[rules.GroupKind] = ()
    ) -> None:
        """Record a ReportOutcomes answer: the reward groups of an accepted report, or a refusal.

        ``kinds``: each group's kind as the store classified it (``ReportResult.kinds``), in the
        order of ``groups``; () (or another length): the groups are classified here.
        """
        c = self._of(source)
        if not accepted:
            c.late_reports += 1
            return
        groups = list(groups)
        known = len(kinds) == len(groups)
        by_kind = c.groups_by_kind
        for i, rewards in enumerate(groups):
            if not rewards:
                continue
            kind = (kinds[i] if known else rules.classify(rewards)).value
            by_kind[kind] = by_kind.get(kind, 0) + 1
            c.completions += len(rewards)
            c.reward_sum += float(sum(rewards))

    def to_proto(self) -> list[pb.ClientStats]:
        """``GetStatsResponse.clients``: one entry per source seen, in enum order."""
        return [
            pb.ClientStats(
                source=s,  # type: ignore[arg-type]  # protobuf stubs type enum fields as the enum; the int value is valid
                leases=c.leases,
                problems_sampled=c.problems_sampled,
                groups=c.groups,
                groups_mixed=c.groups_by_kind.get(rules.GroupKind.MIXED.value, 0),
                completions=c.completions,
                reward_sum=c.reward_sum,
                late_reports=c.late_reports,
            )
            for s, c in sorted(self.counts.items())
        ]


class ClientTallyCollector(Collector):
    """Exports a :class:`ClientTally` as ``prioreplay_client_*{source}`` counters."""

    def __init__(self, tally: ClientTally) -> None:
        self.tally = tally

    def collect(self) -> Iterator[Metric]:
        items = sorted(self.tally.counts.items())
        leases = CounterMetricFamily("prioreplay_client_leases", "leases served, per kind of client", labels=["source"])
        problems = CounterMetricFamily(
            "prioreplay_client_sampled_problems", "problems leased, per kind of client", labels=["source"]
        )
        groups = CounterMetricFamily(
            "prioreplay_client_groups", "groups of accepted reports, per kind of client", labels=["source", "kind"]
        )
        completions = CounterMetricFamily(
            "prioreplay_client_completions", "completions of accepted reports, per kind of client", labels=["source"]
        )
        late = CounterMetricFamily(
            "prioreplay_client_late_reports",
            "reports refused (lease unknown, expired or already reported), per kind of client",
            labels=["source"],
        )
        for s, c in items:
            label = LABELS[s]
            leases.add_metric([label], c.leases)
            problems.add_metric([label], c.problems_sampled)
            for kind in rules.GroupKind:
                groups.add_metric([label, kind.value], c.groups_by_kind.get(kind.value, 0))
            completions.add_metric([label], c.completions)
            late.add_metric([label], c.late_reports)
        yield from (leases, problems, groups, completions, late)


__all__ = ["LABELS", "ClientCounts", "ClientTally", "ClientTallyCollector", "normalize"]
