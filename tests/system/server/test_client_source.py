"""The ``client_source`` of SampleProblems / ReportOutcomes reaches GetStats, ``/metrics`` and ``prioreplay stats``.

An in-process server over each store; every count is checked against what the test itself sent.
"""

from __future__ import annotations

import json

import pytest

from prioreplay.apps import cli
from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.priority_server.config import ServerConfig
from prioreplay.v1 import priority_service_pb2 as pb


def server_config() -> ServerConfig:
    """The configuration of the ``server`` fixture (tests/conftest.py): one server per store."""
    return ServerConfig(store="memory", metrics_port=0, snapshot_interval_s=0, seed=3)


@pytest.fixture
def client(server):
    c = PriorityClient(ClientSettings(server=server.address), max_retries=0)
    c.register(pb.Problem(id=f"p{i}", prompt=f"{i}+1=", answer=str(i + 1)) for i in range(12))
    yield c
    c.close()


def _outcome(problem_id: str, rewards: list[float]) -> pb.ProblemOutcome:
    return pb.ProblemOutcome(problem_id=problem_id, completions=[pb.Completion(reward=r) for r in rewards])


def _lease_and_report(client, source: int, rewards: list[list[float]]) -> pb.SampleProblemsResponse:
    lease = client.sample(len(rewards), client_source=source)
    outcomes = [_outcome(lp.problem.id, r) for lp, r in zip(lease.problems, rewards, strict=True)]
    assert client.report(lease.lease_id, outcomes, client_source=source).accepted
    return lease


def test_each_kind_of_client_is_counted_under_its_own_label(client, server, capsys):
    _lease_and_report(client, pb.CLIENT_SOURCE_TRL, [[1, 0], [1, 1], [0, 0]])  # mixed, all-correct, all-wrong
    _lease_and_report(client, pb.CLIENT_SOURCE_WORKER, [[0, 1, 1, 1]])
    late = _lease_and_report(client, pb.CLIENT_SOURCE_VERL, [[0.5, 0.5]])
    again = client.report(late.lease_id, [_outcome(late.problems[0].problem.id, [1.0, 1.0])], client_source=pb.CLIENT_SOURCE_VERL)
    assert not again.accepted  # a repeated report: counted as late for verl, nothing else changes
    client.sample(2, client_source=99)  # a value this server does not know: unspecified, never refused

    stats = client.stats()
    by = {c.source: c for c in stats.clients}
    assert list(by) == [pb.CLIENT_SOURCE_UNSPECIFIED, pb.CLIENT_SOURCE_WORKER, pb.CLIENT_SOURCE_TRL, pb.CLIENT_SOURCE_VERL]
    trl = by[pb.CLIENT_SOURCE_TRL]
    assert (
        trl.leases,
        trl.problems_sampled,
        trl.groups,
        trl.groups_mixed,
        trl.completions,
        trl.reward_sum,
        trl.late_reports,
    ) == (1, 3, 3, 1, 6, 3.0, 0)
    w = by[pb.CLIENT_SOURCE_WORKER]
    assert (w.groups, w.groups_mixed, w.completions, w.reward_sum) == (1, 1, 4, 3.0)
    v = by[pb.CLIENT_SOURCE_VERL]
    assert (v.groups, v.completions, v.late_reports) == (1, 2, 1)
    assert (by[pb.CLIENT_SOURCE_UNSPECIFIED].leases, by[pb.CLIENT_SOURCE_UNSPECIFIED].problems_sampled) == (1, 2)
    # the per-client counts add up to the store's totals of accepted reports
    assert sum(c.completions for c in stats.clients) == stats.completions_reported == 12
    assert sum(c.groups_mixed for c in stats.clients) == stats.groups_mixed

    text = server.runtime.metrics.render().decode()
    assert 'prioreplay_client_groups_total{kind="mixed",source="trl"} 1.0' in text
    assert 'prioreplay_client_groups_total{kind="all_wrong",source="trl"} 1.0' in text
    assert 'prioreplay_client_late_reports_total{source="verl"} 1.0' in text
    assert 'prioreplay_client_sampled_problems_total{source="unspecified"} 2.0' in text
    assert 'source="99"' not in text

    assert cli.main(["stats", "--server", server.address, "--as-json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [c["source"] for c in d["clients"]] == ["unspecified", "worker", "trl", "verl"]
    assert cli.main(["stats", "--server", server.address]) == 0
    out = capsys.readouterr().out
    assert "clients (since this server process started):" in out
    assert "trl          leases 1, problems 3, groups 3 (mixed 1), completions 6, mean reward 0.500" in out


def test_stats_print_no_client_section_before_any_traffic(client, server, capsys):
    assert list(client.stats().clients) == []
    assert cli.main(["stats", "--server", server.address]) == 0
    assert "clients (" not in capsys.readouterr().out


# -- rewards-only reports: a trainer that learns on its own fills no learner queue ----------------
def test_a_rewards_only_report_updates_statistics_and_queues_nothing(client):
    lease = client.sample(2, client_source=pb.CLIENT_SOURCE_TRL)
    outcomes = [_outcome(lease.problems[0].problem.id, [1, 0, 0]), _outcome(lease.problems[1].problem.id, [1, 1, 1])]
    resp = client.report(lease.lease_id, outcomes, client_source=pb.CLIENT_SOURCE_TRL, rewards_only=True)
    assert (resp.accepted, resp.groups_queued, resp.groups_filtered) == (True, 0, 1)
    s = client.stats()
    assert (s.groups_mixed, s.groups_all_correct, s.completions_reported, s.queue_depth) == (1, 1, 6, 0)
    assert (s.solved, s.leased) == (1, 0)  # the all-correct problem moved to the solved pool as for a worker

    lease = client.sample(1)  # the same mixed report from a worker is queued
    resp = client.report(lease.lease_id, [_outcome(lease.problems[0].problem.id, [1, 0])])
    assert (resp.groups_queued, client.stats().queue_depth) == (1, 1)


async def test_both_stores_never_queue_a_mixed_group_with_an_empty_payload(store_factory):
    from prioreplay.priority_server.store.records import GroupOutcome
    from prioreplay.problems import ProblemRecord

    store = store_factory()
    await store.register([ProblemRecord(id=f"q{i}", prompt="x", answer="y") for i in range(3)])
    lease = await store.sample(3)
    ids = [p.problem.id for p in lease.problems]
    res = await store.report(
        lease.lease_id,
        [GroupOutcome(ids[0], (0.0, 1.0)), GroupOutcome(ids[1], (1.0, 0.0), b"g"), GroupOutcome(ids[2], (0.0, 0.0))],
    )
    assert (res.accepted, res.groups_queued, res.groups_filtered) == (True, 1, 1)
    s = await store.stats()
    assert (s.groups_mixed, s.groups_all_wrong, s.queue_depth) == (2, 1, 1)
    assert [d.payload for d in await store.pull("c", 10, False)] == [b"g"]
