"""The parent's sum over ``--processes N`` children, without processes: the children's expositions
are given as texts, a stalled child as a scrape that times out."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from prioreplay.priority_server import multiprocess
from prioreplay.priority_server.multiprocess import AggregateCollector, merge_exposition


def _child(rpcs: int, groups: int, queue: int) -> str:
    return (
        "# HELP prioreplay_rpc_latency_seconds RPC handling time\n# TYPE prioreplay_rpc_latency_seconds histogram\n"
        f'prioreplay_rpc_latency_seconds_bucket{{le="+Inf",method="GetStats"}} {rpcs}\n'
        f'prioreplay_rpc_latency_seconds_count{{method="GetStats"}} {rpcs}\n'
        f'prioreplay_rpc_latency_seconds_sum{{method="GetStats"}} {rpcs / 1000}\n'
        "# HELP prioreplay_groups_total reported groups\n# TYPE prioreplay_groups_total counter\n"
        f'prioreplay_groups_total{{kind="mixed"}} {groups}\n'
        "# HELP prioreplay_trajectory_queue_depth groups queued\n# TYPE prioreplay_trajectory_queue_depth gauge\n"
        f"prioreplay_trajectory_queue_depth {queue}\n"
    )


def _value(text: str, sample: str) -> float:
    m = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    assert m, sample
    return float(m.group(1))


def test_store_counters_take_the_freshest_read_and_gauges_the_first_process():
    merged = CollectorRegistry()
    fams = merge_exposition([_child(3, groups=10, queue=4), _child(5, groups=12, queue=7)])
    merged.register(type("C", (), {"collect": lambda self: iter(fams)})())
    text = generate_latest(merged).decode()
    assert _value(text, 'prioreplay_rpc_latency_seconds_count{method="GetStats"}') == 8  # summed
    assert _value(text, 'prioreplay_groups_total{kind="mixed"}') == 12  # the larger (fresher) read
    assert _value(text, "prioreplay_trajectory_queue_depth") == 4  # the first text's


@pytest.fixture
def children(monkeypatch):
    """``texts[url]``: what each child answers; a URL in ``stalled`` times out."""
    state = {"texts": {}, "stalled": set()}

    def fetch(url, timeout_s):
        if url in state["stalled"]:
            raise TimeoutError("timed out")
        return state["texts"][url]

    monkeypatch.setattr(multiprocess, "_fetch", fetch)
    return state


def _scrape(collector: AggregateCollector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def test_a_stalled_child_keeps_its_last_values_in_the_sums(children):
    urls = ["http://a/metrics", "http://b/metrics"]
    collector = AggregateCollector(urls, timeout_s=0.1)
    try:
        children["texts"] = {urls[0]: _child(3, 10, 4), urls[1]: _child(5, 11, 2)}
        before = _scrape(collector)
        children["stalled"] = {urls[1]}
        children["texts"][urls[0]] = _child(4, 11, 1)
        during = _scrape(collector)
        count = 'prioreplay_rpc_latency_seconds_count{method="GetStats"}'
        assert _value(before, count) == 8 and _value(during, count) == 9  # 4 fresh + 5 last known, never less
        assert _value(during, "prioreplay_server_processes") == 1
        assert _value(during, 'prioreplay_server_process_up{process="2"}') == 0
        assert _value(during, 'prioreplay_server_process_rpcs_total{process="2"}') == 5
        assert _value(during, "prioreplay_trajectory_queue_depth") == 1  # gauges from a child that answered
    finally:
        collector.close()


def test_a_restarted_child_keeps_its_earlier_life_in_the_sums(children):
    """The parent restarted child 2 (no heartbeat): its counters start again from 0, and the last
    exposition of its killed life stays in the sums (counters and histograms, not gauges)."""
    urls = ["http://a/metrics", "http://b/metrics"]
    collector = AggregateCollector(urls, timeout_s=0.1)
    try:
        children["texts"] = {urls[0]: _child(3, 10, 4), urls[1]: _child(5, 11, 2)}
        before = _scrape(collector)
        collector.retire(1)
        children["texts"][urls[1]] = _child(1, 12, 9)  # the new life: 1 RPC so far
        after = _scrape(collector)
        count = 'prioreplay_rpc_latency_seconds_count{method="GetStats"}'
        assert _value(before, count) == 8 and _value(after, count) == 3 + 5 + 1  # never less
        assert _value(after, 'prioreplay_server_process_rpcs_total{process="2"}') == 6
        assert _value(after, 'prioreplay_server_process_restarts_total{process="2"}') == 1
        assert _value(after, 'prioreplay_server_process_restarts_total{process="1"}') == 0
        assert _value(after, 'prioreplay_groups_total{kind="mixed"}') == 12  # a store counter: the freshest read
        assert _value(after, "prioreplay_trajectory_queue_depth") == 4  # gauges only from the living
    finally:
        collector.close()
